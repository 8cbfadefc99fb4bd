"""The bearer token that guards control endpoints (and, with protect_inference, everything but health).

Kept in ``<state-dir>/auth-token`` unless the ``auth_token`` setting gives one; used by every front end
(REST, gRPC), so it lives here, free of any transport.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import tempfile
from pathlib import Path

from appliance.core.errors import ConfigError
from appliance.runtime.state import StateDir
from appliance.settings.sections import AuthSection

__all__ = ["MIN_TOKEN_LENGTH", "control_token", "ensure_token"]

log = logging.getLogger(__name__)

MIN_TOKEN_LENGTH = 16


def control_token(auth: AuthSection, state_dir: Path, state: StateDir) -> str:
    """The configured token, else the one saved in the state dir; one that cannot be saved (or read)
    is kept in memory, so that the daemon still starts (blocking)."""
    if auth.token:
        return auth.token
    try:  # an empty or short token file is a ConfigError: the daemon refuses to start and says why
        return ensure_token(state_dir)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    state.note("token_not_saved",
               f"the control token in {state_dir / 'auth-token'} cannot be read or saved ({problem}): "
               f"using a one-off token kept in memory, so until a restart the token-protected endpoints "
               f"(load/unload; everything but health with protect_inference) answer only clients in "
               f"auth_exempt_networks",
               "make the state dir writable (a missing token file is then created), or set the "
               "auth_token setting (APPLIANCE_AUTH_TOKEN), and restart")
    return secrets.token_urlsafe(32)


def ensure_token(state_dir: Path) -> str:
    """The token in <state_dir>/auth-token, created 0600 on first start (blocking).

    Written whole or not at all (a temporary file, fsync, then a link that fails if another process
    made the file first), so a crash or a full disk never leaves an empty token that an empty bearer
    would match."""
    path = state_dir / "auth-token"
    try:
        return _checked(path.read_text().strip(), str(path))
    except FileNotFoundError:
        pass
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd, temporary = tempfile.mkstemp(dir=state_dir, prefix=".auth-token.")  # mode 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(token + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:  # another process won the race: use its token
            return _checked(path.read_text().strip(), str(path))
        _fsync_directory(state_dir)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
    log.info("created the control token in %s (mode 0600)", path)
    return token


def _checked(token: str, source: str) -> str:
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(
            f"the control token in {source} is empty or shorter than {MIN_TOKEN_LENGTH} characters (was a "
            "write cut short?); delete the file and restart to have a new one made, or set a token of at "
            "least 32 random characters"
        )
    return token


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
