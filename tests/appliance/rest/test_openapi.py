"""The OpenAPI description covers every route the application serves, and is valid OpenAPI 3."""

from __future__ import annotations

import re

from appliance.backends import RuntimeOptions
from appliance.protocol.dataplane import DataPlane
from appliance.repository.registry import ModelRegistry
from appliance.rest.app import build_app
from appliance.rest.openapi import openapi_document
from appliance.rest.rest_config import BodyLimits, RestConfig


def _spec_path(route_path: str) -> str:
    # aiohttp's static resource is a prefix; the spec names its file parameter.
    return "/dashboard/static/{filename}" if route_path.startswith("/dashboard/static") else route_path


async def test_every_route_is_described(tmp_path):
    plane = DataPlane(ModelRegistry(tmp_path, RuntimeOptions()))
    app = build_app(plane, RestConfig(BodyLimits(1 << 20, 5.0)))
    document = openapi_document()
    described = {(path, method.upper()) for path, operations in document["paths"].items() for method in operations}
    served = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        info = route.resource.get_info()
        path = info.get("formatter") or info.get("path") or info.get("prefix")
        served.add((_spec_path(path), route.method))
    assert served - described == set(), "routes missing from /v2/openapi.json"
    assert described - served == set(), "described routes the app does not serve"


def test_document_is_well_formed():
    document = openapi_document()
    assert document["openapi"].startswith("3.")
    for path, operations in document["paths"].items():
        parameters = set(re.findall(r"{(\w+)}", path))
        for operation in operations.values():
            declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert declared == parameters, path
            assert "200" in operation["responses"]
