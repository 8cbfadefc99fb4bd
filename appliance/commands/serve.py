"""``appliance serve``: its flags (Triton's, as tritonserver spells them, where it has them) and its run."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from appliance.commands import triton_flags
from appliance.settings import Settings
from appliance.settings.trace_flags import TRACE_SPELLINGS, trace_flags

__all__ = ["add_parser", "run", "serve_flags", "trace_settings", "triton_settings"]


_boolean = triton_flags.boolean  # Triton's boolean flag values (``--grpc-use-ssl=true``)


class _OneRepository(argparse.Action):
    """--model-repository (and Triton's --model-store): Triton takes several repositories, the appliance
    serves one; the same one named twice is fine."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        given = getattr(namespace, self.dest, None)
        if given is not None and given != values:
            raise argparse.ArgumentError(self, f"the appliance serves one model repository, given {given} and "
                                               f"{values}: merge them into one directory")
        setattr(namespace, self.dest, values)


def _default(key: str) -> Any:
    """A setting's default as its section declares it: help text never types a default a second time."""
    return triton_flags.default(key)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="serve a Triton-layout model repository over KServe v2 (HTTP and gRPC)")
    p.add_argument("--model-repository", "--model-store", type=Path, action=_OneRepository,
                   help="model repository (default: the built-in example)")
    p.add_argument("--host", help=f"address to bind (default {_default('host')})")
    p.add_argument("--http-port", type=int, help=f"HTTP port (default {_default('http_port')}; 0 picks a free one)")
    p.add_argument("--grpc-port", type=int, help=f"gRPC port (default {_default('grpc_port')}; 0 picks a free one)")
    p.add_argument("--no-grpc", dest="grpc", action="store_const", const=False, help="serve HTTP only, no gRPC")
    for port in ("http", "grpc"):  # Triton's gRPC flags, as it spells them, and the same shape for HTTP
        p.add_argument(f"--{port}-use-ssl", dest=f"{port}_use_ssl", nargs="?", const=True, type=_boolean,
                       metavar="BOOL", help=f"serve {port.upper()} over TLS (=true or =false; see docs/tls.md)")
        p.add_argument(f"--{port}-server-cert", dest=f"{port}_server_cert", metavar="PATH",
                       help="PEM certificate (default: the box's own, from `appliance tls init`)")
        p.add_argument(f"--{port}-server-key", dest=f"{port}_server_key", metavar="PATH",
                       help="PEM private key, mode 0600")
        p.add_argument(f"--{port}-root-cert", dest=f"{port}_root_cert", metavar="PATH",
                       help="PEM CA bundle that client certificates must chain to (mutual TLS)")
        p.add_argument(f"--{port}-use-ssl-mutual", dest=f"{port}_use_ssl_mutual", nargs="?", const=True,
                       type=_boolean, metavar="BOOL", help="require a client certificate (=true or =false)")
    p.add_argument("--state-dir", type=Path, help="where the daemon keeps its files (cache, metrics)")
    p.add_argument("--no-mdns", dest="mdns", action="store_const", const=False, help="do not announce on the LAN")
    p.add_argument("--name", help="the box's name on the LAN (default: the hostname)")
    p.add_argument("--mdns-interface", dest="mdns_interfaces", action="append", metavar="ADDR",
                   help="announce only on the interface with this IPv4 address (repeatable)")
    p.add_argument("--max-request-bytes", type=int, help="largest request body accepted (HTTP 413 above)")
    p.add_argument("--strict-readiness", dest="strict_readiness", nargs="?", const=True, type=_boolean,
                   metavar="BOOL", help="ready only when every model is ready (default "
                   f"{str(triton_flags.default('strict_readiness')).lower()}, as Triton)")
    p.add_argument("--no-strict-readiness", dest="strict_readiness", action="store_const", const=False,
                   help="ready while some models are not (as --strict-readiness=false)")
    p.add_argument("--log-level", help=f"DEBUG, INFO, WARNING or ERROR (default {_default('log_level')})")
    p.add_argument("--metrics-port", type=int, help="also serve /metrics alone on this port (default "
                   f"{triton_flags.default('metrics_port')}, as Triton; 0 picks a free one)")
    p.add_argument("--no-metrics-port", dest="metrics_port", action="store_const", const="",
                   help="no port of its own for /metrics (still on the HTTP port)")
    p.add_argument("--no-metrics", dest="metrics", action="store_const", const=False,
                   help="keep no history and serve no /metrics")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"],
                   help="none: load all; poll: re-scan the repository; explicit: load/unload over the API")
    p.add_argument("--load-model", dest="load_models", action="append", metavar="NAME",
                   help="in explicit mode, load this model at start (repeatable; '*' for all)")
    p.add_argument("--repository-poll-secs", type=float, help="poll mode: seconds between re-scans "
                                                                   f"(default {_default('repository_poll_secs'):g})")
    p.add_argument("--load-on-demand", dest="load_on_demand", action="store_const", const=True,
                   help="load a model on its first request (at start only --load-model ones, pinned); docs/memory.md")
    p.add_argument("--idle-unload-secs", dest="idle_unload_secs", type=float, metavar="N",
                   help="unload a model after N seconds without a request (default 0: never)")
    p.add_argument("--model-memory-budget-mib", dest="model_memory_budget_mib", type=int, metavar="M",
                   help="MiB the loaded models may hold together; idle models are unloaded to make room")
    p.add_argument("--memory-pressure-threshold", dest="memory_pressure_threshold", type=float, metavar="PERCENT",
                   help="unload idle models while PSI memory pressure (some avg10) is at least this (default 0: off)")
    p.add_argument("--exit-timeout-secs", dest="exit_timeout", type=float,
                   help="at stop, seconds to wait for Python model processes stuck in a call before killing "
                        f"them (default {_default('exit_timeout'):g}, as Triton)")
    p.add_argument("--request-deadline", dest="request_deadline", type=float, metavar="SECONDS",
                   help="cancel a streamed request or a BLS call that has not ended after this many seconds "
                        f"(default {_default('request_deadline'):g}: never, as Triton)")
    p.add_argument("--no-selection", dest="selection", action="store_const", const=False,
                   help="serve each model with its config's backend, without measuring plans")
    p.add_argument("--retune", action="store_const", const=True, help="ignore cached plan decisions, measure again")
    p.add_argument("--push-max-file-bytes", type=int, help="largest file a model push may carry (413 above)")
    p.add_argument("--push-max-total-bytes", type=int, help="bytes of all pushed models kept together (413 above)")
    p.add_argument("--event-loop", choices=["auto", "uvloop", "asyncio"],
                   help="auto: uvloop when installed (the default), else asyncio's own loop")
    p.add_argument("--client-shm", choices=["off", "local", "any"],
                   help="who may use shared memory: off, local (clients on this host; the default) or any")
    p.add_argument("--cache-config", dest="cache_config", action="append", metavar="CACHE,KEY=VALUE",
                   help="keep responses of models with response_cache { enable: true } (Triton's flag): "
                        "local,size=BYTES, or redis,host=HOST and redis,port=PORT (repeatable)")
    p.add_argument("--rate-limit", type=str.lower, choices=["execution_count", "off"],
                   help="execution_count: run instances only when their rate_limiter resources are free "
                        "(Triton's flag; default off)")
    p.add_argument("--rate-limit-resource", dest="rate_limit_resources", action="append",
                   metavar="NAME:COUNT[:DEVICE]", help="copies of a rate-limiter resource (repeatable)")
    p.add_argument("--trace-config", dest="trace_config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
                   help="Triton's trace settings at start: level=OFF|TIMESTAMPS|TENSORS, rate=N, count=N, "
                        "mode=triton, triton,file=PATH, triton,log-frequency=N (repeatable)")
    for flag, kind in (("--trace-file", str), ("--trace-rate", int), ("--trace-count", int),
                       ("--trace-log-frequency", int)):
        p.add_argument(flag, dest=flag[2:].replace("-", "_"), type=kind, help=argparse.SUPPRESS)
    p.add_argument("--trace-level", dest="trace_levels", action="append", default=[], help=argparse.SUPPRESS)
    triton_flags.add_arguments(p)  # the rest of tritonserver's command line


def serve_flags() -> dict[str, tuple[str, ...]]:
    """The settings ``appliance serve`` takes as flags: each setting's key and its flags."""
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    (serve,) = sub.choices.values()
    flags: dict[str, tuple[str, ...]] = {}
    for action in serve._actions:
        if action.option_strings and not action.dest.startswith("triton_"):
            flags[action.dest] = flags.get(action.dest, ()) + tuple(action.option_strings)
    for name in ("help", "trace_config", "trace_file", "trace_levels", "trace_rate", "trace_count",
                 "trace_log_frequency"):
        flags.pop(name, None)
    flags.update({setting: (spelling,) for setting, spelling in TRACE_SPELLINGS.items()})
    for row in triton_flags.FLAGS:  # Triton's flags that set a setting as they are (--id, --http-address...)
        if row.sets is not None:
            flags[row.sets] = flags.get(row.sets, ()) + (row.flag,)
    return flags


def run(args: argparse.Namespace, settings: Settings) -> int:
    """Serve until SIGTERM or SIGINT (appliance.commands.daemon), on uvloop where it is installed."""
    from appliance.commands.daemon import serve
    from appliance.runtime import event_loop

    name = event_loop.loop_name(settings.server.event_loop)
    log = logging.getLogger("appliance")
    for notice in triton_flags.read(vars(args)).notices:  # once each: Triton's flags that do less here
        log.info("%s", notice)
    log.info("event loop: %s", name)
    event_loop.run(serve(settings), settings.server.event_loop)
    return 0


def trace_settings(flags: dict[str, Any]) -> dict[str, object]:
    """tritonserver's trace flags (taken out of ``flags``) as trace settings."""
    return trace_flags(flags.pop("trace_config"), file=flags.pop("trace_file"), levels=flags.pop("trace_levels"),
                       rate=flags.pop("trace_rate"), count=flags.pop("trace_count"),
                       log_frequency=flags.pop("trace_log_frequency"))


def triton_settings(flags: dict[str, Any]) -> dict[str, object]:
    """tritonserver's flags that ``appliance serve`` has not of its own (appliance.commands.triton_flags) as
    settings; ConfigError for a refused one."""
    return triton_flags.read(flags).settings
