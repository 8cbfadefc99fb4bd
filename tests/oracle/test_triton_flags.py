"""Every flag real ``tritonserver --help`` (2.51) lists is in the appliance's flag table and its parser: a
Triton command line never stops ``appliance serve`` with "unrecognized arguments"."""

from __future__ import annotations

import argparse
import re
import subprocess

from appliance.cli import _parser
from appliance.commands import serve
from appliance.commands.triton_flags import FLAGS, boolean


def _tritons_flags(triton_install) -> list[str]:
    result = subprocess.run([str(triton_install.tritonserver), "--help"], capture_output=True, text=True,
                            timeout=60, env=triton_install.server_environment())
    return re.findall(r"^  (--[a-z0-9-]+)", result.stdout + result.stderr, re.MULTILINE)


def test_every_flag_of_tritonserver_help_is_in_the_table_and_the_parser(triton_install):
    flags = _tritons_flags(triton_install)
    assert len(flags) > 80, f"could not read tritonserver --help: {flags}"
    rows = {row.flag: row for row in FLAGS}
    assert [flag for flag in flags if flag not in rows] == [], "add these flags to appliance.commands.triton_flags"
    sub = argparse.ArgumentParser().add_subparsers()
    serve.add_parser(sub)
    known = set(sub.choices["serve"]._option_string_actions)
    assert [flag for flag in flags if flag not in known] == [], "appliance serve lacks these flags"
    assert [row.flag for row in FLAGS if row.flag not in flags] == [], "rows for flags tritonserver 2.51 lacks"


def test_each_flag_parses_with_tritons_syntax(triton_install):
    parser = _parser(["serve"])
    for flag in _tritons_flags(triton_install):
        row = next(row for row in FLAGS if row.flag == flag)
        if row.own or row.kind is None:
            continue  # serve's own flags have tests of their own; value-less flags take no value
        value = {boolean: "FALSE", int: "0", float: "1.5"}.get(row.kind, "x,y=z")
        args = parser.parse_args(["serve", f"{flag}={value}"])
        assert getattr(args, row.dest) is not None, flag
