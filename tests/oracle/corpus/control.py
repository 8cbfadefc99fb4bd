"""Health, metadata, configuration, repository index, trace and log settings, statistics."""

from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

from tests.oracle.corpus.case import Case, get, post
from tests.oracle.wire import Grpc, Http

__all__ = ["all_statistics", "health_and_metadata", "logging", "repository_index", "statistics", "trace"]

MODELS = ("identity", "add_sub", "double", "strings", "text", "repeat", "accumulator", "fails", "pipeline")


def health_and_metadata() -> list[Case]:
    cases = [
        get("health.live", "/v2/health/live"),
        get("health.ready", "/v2/health/ready"),
        get("server.metadata", "/v2"),
        get("model.ready", "/v2/models/identity/ready"),
        get("model.ready.version", "/v2/models/identity/versions/1/ready"),
        get("model.ready.unknown_version", "/v2/models/identity/versions/7/ready"),
        get("model.ready.unknown_model", "/v2/models/nope/ready"),
        get("model.metadata.unknown_model", "/v2/models/nope"),
        get("model.metadata.unknown_version", "/v2/models/identity/versions/7"),
        get("model.metadata.bad_version", "/v2/models/identity/versions/one"),
        get("model.config.unknown_model", "/v2/models/nope/config"),
        get("model.config.version", "/v2/models/identity/versions/1/config"),
        get("unknown_path", "/v2/nothing/here"),
        Case("http.method.delete_server", Http("DELETE", "/v2")),
        Case("http.method.get_infer", Http("GET", "/v2/models/identity/infer")),
        Case("http.method.put_config", Http("PUT", "/v2/models/identity/config", b"{}")),
        Case("grpc.health.live", Grpc("ServerLive", pb.ServerLiveRequest())),
        Case("grpc.health.ready", Grpc("ServerReady", pb.ServerReadyRequest())),
        Case("grpc.server.metadata", Grpc("ServerMetadata", pb.ServerMetadataRequest())),
        Case("grpc.model.ready", Grpc("ModelReady", pb.ModelReadyRequest(name="identity"))),
        Case("grpc.model.ready.version", Grpc("ModelReady", pb.ModelReadyRequest(name="identity", version="1"))),
        Case("grpc.model.ready.unknown_version",
             Grpc("ModelReady", pb.ModelReadyRequest(name="identity", version="7"))),
        Case("grpc.model.ready.unknown_model", Grpc("ModelReady", pb.ModelReadyRequest(name="nope"))),
        Case("grpc.model.metadata.unknown_model", Grpc("ModelMetadata", pb.ModelMetadataRequest(name="nope"))),
        Case("grpc.model.metadata.unknown_version",
             Grpc("ModelMetadata", pb.ModelMetadataRequest(name="identity", version="7"))),
        Case("grpc.model.metadata.bad_version",
             Grpc("ModelMetadata", pb.ModelMetadataRequest(name="identity", version="one"))),
        Case("grpc.model.config.unknown_model", Grpc("ModelConfig", pb.ModelConfigRequest(name="nope"))),
        Case("grpc.model.config.empty_name", Grpc("ModelConfig", pb.ModelConfigRequest(name=""))),
    ]
    for model in MODELS:
        cases += [
            get(f"model.metadata.{model}", f"/v2/models/{model}"),
            get(f"model.config.{model}", f"/v2/models/{model}/config"),
            Case(f"grpc.model.metadata.{model}", Grpc("ModelMetadata", pb.ModelMetadataRequest(name=model))),
            Case(f"grpc.model.config.{model}", Grpc("ModelConfig", pb.ModelConfigRequest(name=model))),
        ]
    return cases


def repository_index(tag: str) -> list[Case]:
    return [
        post(f"repository.index.{tag}", "/v2/repository/index", {}),
        post(f"repository.index.ready.{tag}", "/v2/repository/index", {"ready": True}),
        Case(f"grpc.repository.index.{tag}", Grpc("RepositoryIndex", pb.RepositoryIndexRequest())),
        Case(f"grpc.repository.index.ready.{tag}", Grpc("RepositoryIndex", pb.RepositoryIndexRequest(ready=True))),
    ]


def _trace_grpc(name: str, model: str = "", **settings: list[str] | None) -> Case:
    request = pb.TraceSettingRequest(model_name=model)
    for key, values in settings.items():
        entry = request.settings[key]
        if values is not None:
            entry.value.extend(values)
    return Case(f"grpc.trace.{name}", Grpc("TraceSetting", request))


def trace() -> list[Case]:
    return [
        get("trace.global", "/v2/trace/setting"),
        get("trace.model", "/v2/models/identity/trace/setting"),
        get("trace.unknown_model", "/v2/models/nope/trace/setting"),
        post("trace.set_rate", "/v2/trace/setting", {"trace_rate": "5"}),
        post("trace.set_model_level", "/v2/models/identity/trace/setting", {"trace_level": ["TIMESTAMPS"]}),
        post("trace.clear_model_level", "/v2/models/identity/trace/setting", {"trace_level": None}),
        post("trace.bad_rate", "/v2/trace/setting", {"trace_rate": "often"}),
        post("trace.bad_level", "/v2/trace/setting", {"trace_level": ["LOUD"]}),
        post("trace.unknown_key", "/v2/trace/setting", {"trace_colour": "blue"}),
        post("trace.rate_not_string", "/v2/trace/setting", {"trace_rate": 5}),
        post("trace.set_file", "/v2/trace/setting", {"trace_file": "elsewhere.json"}),
        post("trace.restore_rate", "/v2/trace/setting", {"trace_rate": "1000"}),
        _trace_grpc("global"),
        _trace_grpc("model", "identity"),
        _trace_grpc("unknown_model", "nope"),
        _trace_grpc("set_rate", trace_rate=["7"]),
        _trace_grpc("set_model_level", "identity", trace_level=["TIMESTAMPS"]),
        _trace_grpc("clear_model_level", "identity", trace_level=None),
        _trace_grpc("bad_rate", trace_rate=["often"]),
        _trace_grpc("unknown_key", trace_colour=["blue"]),
        _trace_grpc("set_file", trace_file=["elsewhere.json"]),
        _trace_grpc("restore_rate", trace_rate=["1000"]),
    ]


def _log_grpc(name: str, **settings: bool | int | str) -> Case:
    request = pb.LogSettingsRequest()
    for key, value in settings.items():
        if isinstance(value, bool):
            request.settings[key].bool_param = value
        elif isinstance(value, int):
            request.settings[key].uint32_param = value
        else:
            request.settings[key].string_param = value
    return Case(f"grpc.logging.{name}", Grpc("LogSettings", request))


def logging() -> list[Case]:
    return [
        get("logging.get", "/v2/logging"),
        post("logging.verbose", "/v2/logging", {"log_verbose_level": 1}),
        post("logging.quiet", "/v2/logging", {"log_verbose_level": 0, "log_info": True}),
        post("logging.bad_bool", "/v2/logging", {"log_info": "yes"}),
        post("logging.bad_format", "/v2/logging", {"log_format": "fancy"}),
        post("logging.unknown_key", "/v2/logging", {"log_colour": True}),
        post("logging.set_file", "/v2/logging", {"log_file": "elsewhere.log"}),
        post("logging.negative_verbose", "/v2/logging", {"log_verbose_level": -1}),
        _log_grpc("get"),
        _log_grpc("verbose", log_verbose_level=1),
        _log_grpc("quiet", log_verbose_level=0, log_info=True),
        _log_grpc("bad_bool", log_info="yes"),
        _log_grpc("bad_format", log_format="fancy"),
        _log_grpc("set_file", log_file="elsewhere.log"),
    ]


def statistics() -> list[Case]:
    """Counts and times of ``counted`` and ``counted_repeat``, which only these cases call."""
    from tests.oracle.corpus.tensors import In, Request

    def counted(name: str, values: list[float], shape: list[int]) -> Request:
        return Request("counted", [In("INPUT0", "FP32", shape, values)], id=name)

    repeat = Request("counted_repeat", [In("IN", "INT32", [3], [1, 2, 3])])
    cases = [
        # The stream first: Triton counts a decoupled request once it is released, after its stream ended.
        Case("grpc.stats.call.repeat", Grpc("ModelStreamInfer", stream=(repeat.grpc_message(),)),
             counted="counted_repeat"),
        Case("http.stats.call.one", counted("one", [1.0, 2.0], [1, 2]).http()),
        Case("http.stats.call.batch", counted("batch", [1.0, 2.0], [2, 1]).http()),
        Case("grpc.stats.call.one", counted("one", [1.0], [1, 1]).grpc()),
        # Triton counts a failed request a moment after its error went (CI once read its stats before).
        Case("http.stats.call.raises", counted("raises", [-1.0], [1, 1]).http(), counted="counted"),
        Case("grpc.stats.call.wrong_type", Grpc("ModelInfer", Request(
            "counted", [In("INPUT0", "INT32", [1, 1], [1])]).grpc_message())),
        get("stats.counted", "/v2/models/counted/stats"),
        get("stats.counted.version", "/v2/models/counted/versions/1/stats"),
        get("stats.counted_repeat", "/v2/models/counted_repeat/stats"),
        get("stats.unknown_model", "/v2/models/nope/stats"),
        get("stats.unknown_version", "/v2/models/identity/versions/7/stats"),
        Case("grpc.stats.counted", Grpc("ModelStatistics", pb.ModelStatisticsRequest(name="counted"))),
        Case("grpc.stats.counted_repeat", Grpc("ModelStatistics", pb.ModelStatisticsRequest(name="counted_repeat"))),
        Case("grpc.stats.unknown_model", Grpc("ModelStatistics", pb.ModelStatisticsRequest(name="nope"))),
        Case("grpc.stats.unknown_version", Grpc("ModelStatistics", pb.ModelStatisticsRequest(
            name="identity", version="7"))),
    ]
    return cases


def all_statistics() -> list[Case]:
    """Every model's statistics, where the repository is small and the calls before are known."""
    return [get("stats.all", "/v2/models/stats"),
            Case("grpc.stats.all", Grpc("ModelStatistics", pb.ModelStatisticsRequest()))]
