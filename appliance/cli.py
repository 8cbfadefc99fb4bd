"""The ``appliance`` command line."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType

from appliance import __version__
from appliance.commands import serve
from appliance.core.errors import ApplianceError, ConfigError
from appliance.protocol.log_settings import formatter
from appliance.runtime import log_limit
from appliance.settings import Settings, load_settings

__all__ = ["main", "usage_summary"]

_COMMANDS = {
    "serve": "serve",
    "probe": "probe",
    "tune": "tune",
    "explain": "explain",
    "cache": "cache",
    "stats": "stats",
    "install-service": "install_service",
    "discover": "discover",
    "push": "push",
    "fleet": "fleet",
    "tls": "tls",
}
"""Each command and its module in appliance.commands (``add_parser`` and ``run``). Only the module of the
command given is imported: the daemon does not load the fleet commands' zeroconf or the certificate
command's cryptography (about 25 MiB of a serving daemon's memory)."""


def _command(name: str) -> ModuleType:
    return importlib.import_module(f"appliance.commands.{_COMMANDS[name]}")


def _parser(commands: Iterable[str] = _COMMANDS) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description="Edge inference appliance")
    parser.add_argument("--version", action="version", version=f"appliance {__version__}")
    parser.add_argument("--config", type=Path, help="TOML settings file (also APPLIANCE_CONFIG)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in commands:
        _command(name).add_parser(sub)
    return parser


def _named(argv: Sequence[str]) -> list[str]:
    """The command ``argv`` names, alone, or every command when it names none the parser knows (then the
    parser's help or error lists them all). Before the command come only --config FILE and --version."""
    words = iter(argv)
    for word in words:
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            return [word] if word in _COMMANDS else list(_COMMANDS)
    return list(_COMMANDS)


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
    server = settings.server
    try:  # Triton's --log-file: the log goes to the file instead of standard error
        handler: logging.Handler = (logging.FileHandler(server.log_file) if server.log_file
                                    else logging.StreamHandler(sys.stderr))
    except OSError as exc:
        raise ConfigError(f"log_file: cannot open {server.log_file} ({exc.strerror}); name a file the daemon "
                          "may write, or leave it out to log to standard error") from None
    handler.setFormatter(formatter(server.log_format))
    logging.basicConfig(level=server.log_level.upper(), handlers=[handler])
    for each in logging.getLogger().handlers:
        log_limit.install(each)  # a flood of one message (asyncio's accept errors...) stays a trickle


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = _parser(_named(argv)).parse_args(argv)
    flags = {k: v for k, v in vars(args).items() if k not in ("command", "config")}
    try:
        if args.command == "serve":
            flags.update(serve.trace_settings(flags))
            flags.update(serve.triton_settings(flags))
        settings = load_settings(flags, os.environ, args.config)
        _setup_logging(settings)
        status = _command(args.command).run(args, settings)
        sys.stdout.flush()  # inside the try: a reader gone before the last write is handled below
        return status
    except ApplianceError as exc:
        print(f"appliance: {exc.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`appliance stats --json | head`): as a shell tool does, stop quietly. Python
        # would flush stdout again at exit and print a second BrokenPipeError: point it at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the signal


if __name__ == "__main__":  # prints docs/getting-started.md's command-line block
    print(usage_summary(), end="")
