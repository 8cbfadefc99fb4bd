"""The REST route table: the dashboard's page and files, and the routes every model has per version."""

from __future__ import annotations

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from appliance.rest.handlers import OPERATIONS, ROUTES, dashboard, infer, model_ready


def _app() -> web.Application:
    app = web.Application()
    app.add_routes(ROUTES)
    return app


def test_the_dashboard_files_are_served_right_after_its_page():
    pages = [i for i, route in enumerate(ROUTES) if isinstance(route, web.RouteDef) and route.handler is dashboard]
    files = [i for i, route in enumerate(ROUTES) if isinstance(route, web.StaticDef)]
    assert len(pages) == 1 and files == [pages[0] + 1]
    static = ROUTES[files[0]]
    assert isinstance(static, web.StaticDef) and static.prefix == "/dashboard/static"


async def test_a_dashboard_file_and_the_model_routes_resolve():
    app = _app()
    for method, path, handler in [("GET", "/dashboard/static/app.js", None), ("POST", "/v2/models/m/infer", infer),
                                  ("POST", "/v2/models/m/versions/2/infer", infer),
                                  ("GET", "/v2/models/m/ready", model_ready),
                                  ("GET", "/v2/models/m/versions/2/ready", model_ready)]:
        match = await app.router.resolve(make_mocked_request(method, path, app=app))
        assert match.http_exception is None, path
        if handler is not None:
            assert match.handler is handler and OPERATIONS[handler] is not None
