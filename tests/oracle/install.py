"""Real Triton 2.51 installed into a cache outside the repository, laid out to run on CPU.

NVIDIA's wheels are never committed and never enter the project's venv (tritonclient 2.51 would
replace the project's client): ``pip install --target`` puts them in the cache, once, under a lock.

* ``nvidia-pytriton==0.7.0`` ships ``tritonserver`` with its Python backend. The backend starts
  ``triton_python_backend_stub`` from its own directory, so the stub for the chosen Python is copied
  next to ``libtriton_python.so``. The stub embeds ``libpython3.X.so`` in *isolated* mode: it ignores
  PYTHONPATH and takes its prefix from the first ``python3`` on PATH. So the cache holds a small venv
  (``stub-env``: ``bin/python3`` pointing at that Python, ``pyvenv.cfg``, ``numpy<2`` in its
  site-packages) whose ``bin`` goes first on the server's PATH. Without numpy the models fail to load;
  with numpy 2 every output arrives empty.
* ``tritonclient==2.51.0`` carries ``perf_analyzer``, linked against ``libb64.so.0d`` and
  ``libcudart.so.12``: the pytriton wheel holds both under hashed names, linked here under the names
  perf_analyzer asks for (``perf-libs``, put on LD_LIBRARY_PATH).

Only the binaries are used, so both wheels go in without their dependencies (``--no-deps``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CACHE_ENVIRONMENT", "TritonInstall", "TritonUnavailable", "cache_directory", "install"]

PYTRITON = "nvidia-pytriton==0.7.0"
TRITONCLIENT = "tritonclient[all]==2.51.0"
STUB_NUMPY = "numpy<2"
CACHE_ENVIRONMENT = "EDGE_APPLIANCE_TRITON_CACHE"
"""Environment variable naming the cache directory (default ~/.cache/edge-appliance/triton-2.51)."""
_LAYOUT = 1
"""Bumped when the layout below changes, so an older cache is rebuilt rather than trusted."""
_PIP_TIMEOUT_S = 900
# Stubs in the order they are tried: 3.11 is what the wheel's users run; numpy<2 has no 3.13 wheel.
_STUB_VERSIONS = ("3.11", "3.12", "3.10", "3.9")
_PROBE = (
    "import json, sys, sysconfig; print(json.dumps({'version': '%d.%d' % sys.version_info[:2],"
    " 'shared': sysconfig.get_config_var('Py_ENABLE_SHARED'), 'libdir': sysconfig.get_config_var('LIBDIR'),"
    " 'soname': sysconfig.get_config_var('INSTSONAME'), 'base': getattr(sys, '_base_executable', sys.executable)}))"
)


class TritonUnavailable(RuntimeError):
    """Real Triton cannot be installed, started or driven here; the message says why (tests skip with it)."""


@dataclass(frozen=True)
class TritonInstall:
    """Where the pieces of an installed Triton lie, and the environment each program needs."""

    root: Path
    python_libdir: Path
    """Directory of the shared libpython the stub embeds."""

    @property
    def tritonserver(self) -> Path:
        return self.server_root / "bin" / "tritonserver"

    @property
    def server_root(self) -> Path:
        return self.root / "site" / "pytriton" / "tritonserver"

    @property
    def backend_directory(self) -> Path:
        return self.server_root / "backends"

    @property
    def perf_analyzer(self) -> Path:
        return self.root / "site" / "bin" / "perf_analyzer"

    @property
    def stub_env(self) -> Path:
        return self.root / "stub-env"

    @property
    def perf_libs(self) -> Path:
        return self.root / "perf-libs"

    def server_environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment tritonserver runs in: the stub venv's python3 first on PATH, libpython found."""
        environment = dict(os.environ if base is None else base)
        environment["PATH"] = os.pathsep.join([str(self.stub_env / "bin"), environment.get("PATH", "/usr/bin:/bin")])
        environment["LD_LIBRARY_PATH"] = _prepend(str(self.python_libdir), environment.get("LD_LIBRARY_PATH"))
        # The stub ignores these (isolated), but a stray PYTHONHOME would still confuse the server's scripts.
        environment.pop("PYTHONHOME", None)
        return environment

    def perf_environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment perf_analyzer runs in: libb64.so.0d and libcudart.so.12 found."""
        environment = dict(os.environ if base is None else base)
        environment["LD_LIBRARY_PATH"] = _prepend(str(self.perf_libs), environment.get("LD_LIBRARY_PATH"))
        return environment


def cache_directory() -> Path:
    """The cache directory: $EDGE_APPLIANCE_TRITON_CACHE, else ~/.cache/edge-appliance/triton-2.51."""
    configured = os.environ.get(CACHE_ENVIRONMENT)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "edge-appliance" / "triton-2.51"


def install(root: Path | None = None) -> TritonInstall:
    """Install (once) and return real Triton; raises TritonUnavailable saying why it cannot be done."""
    root = (root or cache_directory()).resolve()
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise TritonUnavailable(f"cannot create the Triton cache {root.parent}: {error}; "
                                f"set {CACHE_ENVIRONMENT} to a writable directory") from error
    with _locked(root.parent / f".{root.name}.lock"):
        found = _read_complete(root)
        if found is not None:
            return found
        partial = root.parent / f".{root.name}.partial-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            python_libdir = _build(partial)
            if root.exists():
                shutil.rmtree(root)
            partial.rename(root)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        (root / "complete.json").write_text(json.dumps({"layout": _LAYOUT, "python_libdir": str(python_libdir)}))
        made = _read_complete(root)
        if made is None:
            raise TritonUnavailable(f"the Triton cache {root} is incomplete right after installing it")
        return made


def _read_complete(root: Path) -> TritonInstall | None:
    try:
        marker = json.loads((root / "complete.json").read_text())
    except (OSError, ValueError):
        return None
    if marker.get("layout") != _LAYOUT:
        return None
    found = TritonInstall(root, Path(marker["python_libdir"]))
    stub_python = found.stub_env / "bin" / "python3"
    required = (found.tritonserver, found.perf_analyzer, found.backend_directory / "python" /
                "triton_python_backend_stub", stub_python.resolve(), found.python_libdir)
    return found if all(path.exists() for path in required) else None


def _build(target: Path) -> Path:
    """Lay out a fresh install in ``target``; returns the libpython directory the stub needs."""
    site = target / "site"
    _pip("install", "--no-deps", "--target", str(site), PYTRITON, TRITONCLIENT)
    server_root = site / "pytriton" / "tritonserver"
    python = _choose_python(server_root / "python_backend_stubs")
    stub = server_root / "python_backend_stubs" / python["version"] / "triton_python_backend_stub"
    placed = server_root / "backends" / "python" / "triton_python_backend_stub"
    shutil.copy2(stub, placed)
    placed.chmod(0o755)
    for program in (server_root / "bin" / "tritonserver", site / "bin" / "perf_analyzer"):
        if not program.exists():
            raise TritonUnavailable(f"the wheels installed without {program.name} (expected at {program})")
        program.chmod(0o755)
    _make_stub_env(target / "stub-env", python)
    _link_perf_libs(site / "nvidia_pytriton.libs", target / "perf-libs")
    return Path(python["libdir"])


def _make_stub_env(env: Path, python: dict) -> None:
    site_packages = env / "lib" / f"python{python['version']}" / "site-packages"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python3").symlink_to(python["base"])
    (env / "pyvenv.cfg").write_text(f"home = {Path(python['base']).parent}\ninclude-system-site-packages = false\n"
                                    f"version = {python['version']}\n")
    _pip("install", "--only-binary=:all:", "--implementation", "cp", "--python-version", python["version"],
         "--target", str(site_packages), STUB_NUMPY)


def _link_perf_libs(libs: Path, target: Path) -> None:
    # auditwheel renamed them (libb64-98cb6333.so.0d); perf_analyzer asks for the plain names.
    target.mkdir()
    for wanted, pattern in (("libb64.so.0d", "libb64-*.so.0d"), ("libcudart.so.12", "libcudart-*.so.12*")):
        matches = sorted(libs.glob(pattern))
        if not matches:
            raise TritonUnavailable(f"{libs} holds no {pattern} for perf_analyzer's {wanted}")
        (target / wanted).symlink_to(os.path.relpath(matches[0], target))


def _choose_python(stubs: Path) -> dict:
    """A Python with a shared libpython for which the wheel carries a stub (3.11 first)."""
    candidates: list[str] = []
    for version in _STUB_VERSIONS:
        candidates += [f"/usr/bin/python{version}", shutil.which(f"python{version}") or ""]
    candidates.insert(1, sys.executable)
    tried: list[str] = []
    for candidate in dict.fromkeys(filter(None, candidates)):
        if not Path(candidate).exists():
            continue
        try:
            probe = json.loads(subprocess.run([candidate, "-c", _PROBE], capture_output=True, text=True,
                                              timeout=30, check=True).stdout)
        except (OSError, ValueError, subprocess.SubprocessError):
            continue
        tried.append(f"{candidate} ({probe['version']})")
        library = Path(probe["libdir"] or "/nonexistent") / (probe["soname"] or "-")
        if probe["shared"] and library.exists() and (stubs / probe["version"]).is_dir():
            return probe
    raise TritonUnavailable(
        "Triton's Python backend stub embeds a shared libpython (3.11, 3.12, 3.10 or 3.9) and none was found "
        f"(tried {', '.join(tried) or 'nothing'}); install one, e.g. apt-get install libpython3.11 python3.11")


def _pip(*arguments: str) -> None:
    command = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "--retries", "1",
               "--timeout", "30", *arguments]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise TritonUnavailable(f"pip could not run ({' '.join(command[3:])}): {error}") from error
    if done.returncode != 0:
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        raise TritonUnavailable(f"pip failed to install {' '.join(arguments[-2:])}: {tail}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    # A bench and a test session installing at once share one download.
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepend(entry: str, existing: str | None) -> str:
    return entry if not existing else f"{entry}{os.pathsep}{existing}"
