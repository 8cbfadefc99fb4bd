"""``appliance install-service``: write the systemd unit for this installation (this venv's appliance)."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

from appliance.settings import Settings
from appliance.systemd.unit import hidden_from_the_service, render_unit, write_unit

__all__ = ["add_parser", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("install-service", help="write the systemd unit that runs this installation")
    parser.add_argument("--unit-path", type=Path, default=Path("/etc/systemd/system/appliance.service"))
    parser.add_argument("--model-repository", dest="unit_repository", type=str,
                        help="repository the service serves (default: the built-in example)")
    parser.add_argument("--http-port", dest="unit_http_port", type=int,
                        help="HTTP port the service listens on (default 8000)")
    parser.add_argument("--grpc-port", dest="unit_grpc_port", type=int,
                        help="gRPC port the service listens on (default 8001)")
    parser.add_argument("--no-grpc", dest="unit_no_grpc", action="store_true", help="the service serves HTTP only")
    parser.add_argument("--print", dest="print_only", action="store_true", help="print the unit, write nothing")


def _executable() -> str:
    # The console script beside this interpreter: the venv the user installed the appliance into.
    beside = Path(sys.executable).with_name("appliance")
    return str(beside) if beside.exists() else shutil.which("appliance") or f"{sys.executable} -m appliance"


def run(args: argparse.Namespace, settings: Settings) -> int:
    arguments: tuple[str, ...] = ("--model-repository", args.unit_repository) if args.unit_repository else ()
    if args.unit_http_port is not None:
        arguments += ("--http-port", str(args.unit_http_port))
    if args.unit_grpc_port is not None:
        arguments += ("--grpc-port", str(args.unit_grpc_port))
    if args.unit_no_grpc:
        arguments += ("--no-grpc",)
    needed = {"appliance executable": _executable().split(" ")[0]}
    if args.unit_repository:
        needed["model repository"] = args.unit_repository
    for warning in hidden_from_the_service(needed):
        print(f"warning: {warning}", file=sys.stderr)
    if args.print_only:
        print(render_unit(_executable(), arguments), end="")
        return 0
    path = write_unit(args.unit_path, _executable(), arguments, "0.0.0.0")
    print(f"wrote {path}\nnext: systemctl daemon-reload && systemctl enable --now {path.stem}")
    return 0
