"""`blink dashboard`: a web page served by the same FastAPI app as the REST service.

Why a FastAPI-served page with its own small SVG charts (blink/dashboard/static/app.js) rather
than Streamlit or a charting library:
  * speed: one static HTML, one CSS and one ~20 KB script, no extra server process or
    websocket protocol; the page calls the same JSON endpoints programs call (/predict,
    /optimize-batch, /compare, /history, /nvml), so the dashboard is a thin view of the API;
  * testability: every chart is plain SVG in the DOM (bars, lines, the budget line have ids and
    classes), so a real headless Chromium can assert that a prediction drew its chart and the
    planner its curve, not only that a canvas exists;
  * no third-party code in the repository and nothing downloaded at run time: the charts are a
    few hundred lines of our own JavaScript (line, bar and timeline charts are all it needs).
"""
from __future__ import annotations

from importlib import resources
from typing import Any

STATIC = resources.files("blink").joinpath("dashboard", "static")


def mount(app: Any) -> None:
    """Serve the page under /dashboard/ of `app`."""
    from fastapi.staticfiles import StaticFiles

    app.mount("/dashboard", StaticFiles(directory=str(STATIC), html=True), name="dashboard")
