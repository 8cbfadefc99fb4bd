"""The box's own id, kept in its state dir: what the mDNS announcement, the fleet panel and the fleet
commands know a box by. Apart from the announcer, so a daemon with mDNS off loads no zeroconf."""

from __future__ import annotations

import uuid
from pathlib import Path

from appliance.runtime.state import StateDir

__all__ = ["box_id"]


def box_id(state_dir: Path, state: StateDir | None = None) -> str:
    """A stable id for this box, kept in the state dir (blocking: call off the loop). One that cannot be
    saved is used for this run and recorded in ``state`` (raised when there is no ``state``)."""
    path = state_dir / "device-id"
    try:
        return str(uuid.UUID(path.read_text().strip()))
    except (OSError, ValueError):
        pass
    value = str(uuid.uuid4())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    except OSError as exc:
        if state is None:
            raise
        state.note("device_id_not_saved",
                   f"the box id cannot be saved to {path} ({exc.strerror or exc}): announcing {value} for this "
                   f"run, so LAN clients see a new box after each restart",
                   "make the state dir writable and restart")
    return value
