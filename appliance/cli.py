"""The ``appliance`` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from appliance import __version__
from appliance.commands import cache, discover, explain, fleet, install_service, probe, push, serve, stats, tls, tune
from appliance.core.errors import ApplianceError
from appliance.runtime import log_limit
from appliance.settings import Settings, load_settings

__all__ = ["main", "usage_summary"]

_COMMANDS = {
    "serve": serve,
    "probe": probe,
    "tune": tune,
    "explain": explain,
    "cache": cache,
    "stats": stats,
    "install-service": install_service,
    "discover": discover,
    "push": push,
    "fleet": fleet,
    "tls": tls,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description="Edge inference appliance")
    parser.add_argument("--version", action="version", version=f"appliance {__version__}")
    parser.add_argument("--config", type=Path, help="TOML settings file (also APPLIANCE_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in _COMMANDS.values():
        command.add_parser(sub)
    return parser


def usage_summary(width: int = 100) -> str:
    """Every subcommand's usage line, as docs/getting-started.md's "Command line" block shows it (a test
    keeps the two equal: regenerate the block with ``python -m appliance.cli``)."""
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    parser.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=width)
    lines = [parser.format_usage().removeprefix("usage: ").rstrip()]
    for command in commands.choices.values():
        command.formatter_class = lambda prog: argparse.HelpFormatter(prog, width=width)
        lines.append(command.format_usage().removeprefix("usage: ").rstrip())
    return "\n".join(lines) + "\n"


def _setup_logging(settings: Settings) -> None:
    logging.basicConfig(
        level=settings.server.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for handler in logging.getLogger().handlers:
        log_limit.install(handler)  # a flood of one message (asyncio's accept errors...) stays a trickle


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    try:
        if args.command == "serve":
            flags.update(serve.trace_settings(flags))
        settings = load_settings(flags, os.environ, args.config)
        _setup_logging(settings)
        return _COMMANDS[args.command].run(args, settings)
    except ApplianceError as exc:
        print(f"appliance: {exc.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # prints docs/getting-started.md's command-line block
    print(usage_summary(), end="")
