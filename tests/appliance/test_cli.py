"""The command line imports only the command it runs (the daemon loads none of the fleet and certificate
commands' libraries), and still lists every command in its help and its errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from appliance.cli import _COMMANDS, _named, main


@pytest.mark.parametrize(("argv", "named"), [
    (["serve", "--http-port", "0"], ["serve"]),
    (["--config", "tls", "serve"], ["serve"]),  # a settings file named like a command is not one
    (["--config=fleet.toml", "fleet", "list"], ["fleet"]),
    (["tls", "init"], ["tls"]),
])
def test_the_command_given_is_the_one_parsed(argv, named):
    assert _named(argv) == named


@pytest.mark.parametrize("argv", [[], ["--help"], ["--version"], ["no-such-command"]])
def test_without_a_known_command_every_command_is_parsed(argv):
    assert _named(argv) == list(_COMMANDS)


def test_running_serve_imports_no_other_command():
    script = ("import json, sys\nfrom appliance.cli import _named, _parser\n"
              "_parser(_named(['serve', '--http-port', '0']))\n"
              "print(json.dumps(sorted(m for m in sys.modules if m.startswith('appliance.commands.')"
              " or m.split('.')[0] in ('zeroconf', 'cryptography', 'redis'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                       check=True, timeout=60).stdout)
    assert loaded == ["appliance.commands.serve", "appliance.commands.triton_flags"]  # serve's flag table


def test_an_unknown_command_is_refused_with_every_command_listed(capsys):
    with pytest.raises(SystemExit):
        main(["no-such-command"])
    error = capsys.readouterr().err
    assert all(name in error for name in _COMMANDS)
