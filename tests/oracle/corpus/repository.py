"""Model control: load and unload (explicit mode), and the same calls refused in mode ``none``."""

from __future__ import annotations

import json
from dataclasses import replace

from tritonclient.grpc import service_pb2 as pb

from tests.oracle.corpus.case import Case, get, post
from tests.oracle.corpus.control import all_statistics, repository_index
from tests.oracle.corpus.tensors import In, Request
from tests.oracle.wire import Grpc

__all__ = ["control_refused", "load_unload"]

# spare is a copy of identity; loading it with this config changes its max_batch_size.
_SPARE_CONFIG = json.dumps({"name": "spare", "backend": "python", "max_batch_size": 4,
                            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]})


def _spare() -> Request:
    return Request("spare", [In("INPUT0", "FP32", [1, 2], [1.0, 2.0])])


def _grpc_load(name: str, model: str, config: str | None = None) -> Case:
    request = pb.RepositoryModelLoadRequest(model_name=model)
    if config is not None:
        request.parameters["config"].string_param = config
    return Case(f"grpc.{name}", Grpc("RepositoryModelLoad", request))


def _grpc_unload(name: str, model: str, dependents: bool = False) -> Case:
    request = pb.RepositoryModelUnloadRequest(model_name=model)
    if dependents:
        request.parameters["unload_dependents"].bool_param = True
    return Case(f"grpc.{name}", Grpc("RepositoryModelUnload", request), settle=True)


def _unload(name: str, model: str, body: dict) -> Case:
    return replace(post(name, f"/v2/repository/models/{model}/unload", body), settle=True)


def _after_unload(tag: str, transport: str) -> list[Case]:
    if transport == "http":
        return [
            get(f"{tag}.ready", "/v2/models/spare/ready"),
            get(f"{tag}.metadata", "/v2/models/spare"),
            get(f"{tag}.config", "/v2/models/spare/config"),
            Case(f"http.{tag}.infer", _spare().http()),
            get(f"{tag}.stats", "/v2/models/spare/stats"),
        ]
    return [
        Case(f"grpc.{tag}.ready", Grpc("ModelReady", pb.ModelReadyRequest(name="spare"))),
        Case(f"grpc.{tag}.metadata", Grpc("ModelMetadata", pb.ModelMetadataRequest(name="spare"))),
        Case(f"grpc.{tag}.config", Grpc("ModelConfig", pb.ModelConfigRequest(name="spare"))),
        Case(f"grpc.{tag}.infer", _spare().grpc()),
        Case(f"grpc.{tag}.stats", Grpc("ModelStatistics", pb.ModelStatisticsRequest(name="spare"))),
    ]


def load_unload() -> list[Case]:
    cases = [
        _unload("unload.spare", "spare", {}),
        *repository_index("after_unload"),
        *_after_unload("unloaded", "http"),
        *_after_unload("unloaded", "grpc"),
        _unload("unload.spare_again", "spare", {}),
        _unload("unload.unknown", "nope", {}),
        post("load.spare", "/v2/repository/models/spare/load", {}),
        Case("http.reloaded.infer", _spare().http()),
        post("load.unknown", "/v2/repository/models/nope/load", {}),
        post("load.spare_config", "/v2/repository/models/spare/load", {"parameters": {"config": _SPARE_CONFIG}}),
        get("load.spare_config.config", "/v2/models/spare/config"),
        post("load.bad_config", "/v2/repository/models/spare/load", {"parameters": {"config": "{not json"}}),
        post("load.config_not_string", "/v2/repository/models/spare/load", {"parameters": {"config": {"a": 1}}}),
        post("load.bad_body", "/v2/repository/models/spare/load", raw=b"{", headers=(("Content-Type",
                                                                                       "application/json"),)),
        _unload("unload.dependents", "spare", {"parameters": {"unload_dependents": True}}),
        post("load.spare_back", "/v2/repository/models/spare/load", {}),
        _grpc_unload("unload.spare", "spare"),
        _grpc_unload("unload.spare_again", "spare"),
        _grpc_unload("unload.unknown", "nope"),
        _grpc_load("load.unknown", "nope"),
        _grpc_load("load.spare", "spare"),
        Case("grpc.reloaded.infer", _spare().grpc()),
        _grpc_load("load.spare_config", "spare", _SPARE_CONFIG),
        Case("grpc.load.spare_config.config", Grpc("ModelConfig", pb.ModelConfigRequest(name="spare"))),
        _grpc_load("load.bad_config", "spare", "{not json"),
        _grpc_unload("unload.dependents", "spare", dependents=True),
        _grpc_load("load.spare_back", "spare"),
        *repository_index("after_reload"),
    ]
    return cases


def control_refused() -> list[Case]:
    """In model control mode ``none`` (a second pair of servers)."""
    return [
        post("none.load", "/v2/repository/models/identity/load", {}),
        _unload("none.unload", "identity", {}),
        post("none.load_unknown", "/v2/repository/models/nope/load", {}),
        _grpc_load("none.load", "identity"),
        _grpc_unload("none.unload", "identity"),
        _grpc_load("none.load_unknown", "nope"),
        *repository_index("none"),
        Case("http.none.infer", Request("identity", [In("INPUT0", "FP32", [1, 2], [1.0, 2.0])]).http()),
        Case("grpc.none.infer", Request("identity", [In("INPUT0", "FP32", [2, 1], [1.0, 2.0])]).grpc()),
        *all_statistics(),
    ]
