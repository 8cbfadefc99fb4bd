"""The daemon's dashboard: static files only (HTML, plain JS, CSS, and a vendored uPlot), no build step.

The page reads the daemon's own JSON APIs (/v2, /v2/probe, /v2/repository/index,
/v2/models/{name}/versions/{version}/selection, /v2/history) from the browser, so this package has no
Python logic: the HTTP layer serves ``STATIC_DIR/index.html`` at ``GET /`` and the files under
``STATIC_DIR`` at ``GET /dashboard/static/{path}``. Everything the page needs ships here, so it works
on a box with no route to the internet.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC_DIR"]

STATIC_DIR = Path(__file__).parent / "static"
