"""Files that hold a secret (a TLS private key, the response cache's signing secret): the daemon uses one
only when its owner alone may read it, since whoever else can read it can act as the box."""

from __future__ import annotations

import stat
from pathlib import Path

from appliance.core.errors import ConfigError

__all__ = ["check_private_file"]


def check_private_file(path: Path, setting: str, *, missing: str, exposed: str) -> None:
    """Refuse a secret file that cannot be found, or that the group or others may read or write: ConfigError
    naming ``setting`` (the flag or setting that gave ``path``), with ``missing`` (how to make or name one)
    or ``exposed`` (what whoever reads it could do) before the fix."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{setting} {path}: {exc.strerror or exc}; {missing}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{setting} {path} can be read by other users (mode {stat.filemode(mode)}); {exposed}: "
                          f"chmod 600 {path}")
