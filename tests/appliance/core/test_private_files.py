"""The check on files holding a secret, shared by the TLS key and the response cache's key file."""

from __future__ import annotations

import re
import stat

import pytest

from appliance.core.errors import ConfigError
from appliance.core.private_files import check_private_file

FIXES = {"missing": "make one with `make-it`", "exposed": "whoever reads it is the box"}


def test_a_file_only_its_owner_may_read_is_taken(tmp_path):
    path = tmp_path / "key"
    path.write_text("secret")
    for mode in (0o600, 0o400, 0o700):
        path.chmod(mode)
        check_private_file(path, "--the-key", **FIXES)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o610, 0o601])
def test_a_file_the_group_or_others_may_touch_is_refused_with_the_fix(tmp_path, mode):
    path = tmp_path / "key"
    path.write_text("secret")
    path.chmod(mode)
    with pytest.raises(ConfigError) as refused:
        check_private_file(path, "--the-key", **FIXES)
    shown = stat.filemode(stat.S_IFREG | mode)
    assert str(refused.value) == (f"--the-key {path} can be read by other users (mode {shown}); whoever reads it "
                                  f"is the box: chmod 600 {path}")


def test_a_missing_file_is_refused_with_how_to_make_one(tmp_path):
    path = tmp_path / "absent"
    with pytest.raises(ConfigError, match=re.escape(f"--the-key {path}: No such file or directory; make one with "
                                                    "`make-it`")):
        check_private_file(path, "--the-key", **FIXES)
