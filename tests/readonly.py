"""Run a command with a directory mounted read-only, as an edge filesystem remounted read-only after
errors looks to the daemon.

The tests run as root, and root ignores mode bits, so ``chmod`` proves nothing. A read-only bind mount
in a private mount namespace (``unshare -m``) does stop root, touches only the one process tree, and
goes away with it. Where namespaces are not allowed (an unprivileged container), the test is skipped.
``unwritable`` needs no mount: a directory that cannot be created.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_SCRIPT = 'mount --bind -o ro "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'


def unwritable(tmp_path: Path) -> Path:
    """A state dir that cannot be created, even by root and without mounts: its parent is a file."""
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "state"


def read_only_prefix(path: Path) -> list[str]:
    """A command prefix: ``[*read_only_prefix(d), "cmd", ...]`` runs cmd with ``d`` read-only."""
    reason = _unavailable()
    if reason:
        pytest.skip(f"cannot mount a read-only directory here ({reason}); needs unshare -m and mount, as root")
    return ["unshare", "-m", "--propagation", "private", "sh", "-c", _SCRIPT, str(path)]


@functools.cache
def _unavailable() -> str:
    if not (shutil.which("unshare") and shutil.which("mount")):
        return "no unshare or mount on PATH"
    with tempfile.TemporaryDirectory() as scratch:
        probe = ["unshare", "-m", "--propagation", "private", "sh", "-c", _SCRIPT, scratch,
                 "sh", "-c", 'touch "$0/x" 2>/dev/null && echo writable || echo read-only', scratch]
        try:
            result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return str(exc)
        if result.stdout.strip() != "read-only":
            return (result.stderr.strip() or result.stdout.strip() or "the mount stayed writable")[:200]
    return ""
