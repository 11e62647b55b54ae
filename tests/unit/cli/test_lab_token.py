"""``imds lab boot --url``: the admin token is ``--admin-token``, else the configured one (IMDS_ADMIN_TOKEN).

The environment is read by ``imds.config`` as for every command; ``imds.lab.server`` only takes
the token it is given, and refuses none.
"""

from __future__ import annotations

from typing import Any

import pytest

from imds.cli.lab import _options, boot
from imds.errors import LabError
from imds.lab.server import remote_server

TOKEN_AT = 10  # the position of admin_token among imds.lab.boot.Options' fields


def _token(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, **flags: Any) -> Any:
    monkeypatch.setenv("HOME", str(tmp_path))
    # every flag of ``imds lab boot`` as not given (off), then the few the options need
    chosen = {param.name: False if getattr(param, "is_flag", False) else None for param in boot.params}
    chosen |= {"flavor": "ec2", "out": tmp_path, "identify": "forced"} | flags
    made = _options(lambda *args, **_kw: args, chosen, None, None)
    return made[TOKEN_AT]


def test_the_flag_wins_over_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("IMDS_ADMIN_TOKEN", "from-env")
    assert _token(monkeypatch, tmp_path, url="http://127.0.0.1:9", admin_token="from-flag") == "from-flag"


def test_with_url_and_no_flag_the_configured_token_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("IMDS_ADMIN_TOKEN", "from-env")
    assert _token(monkeypatch, tmp_path, url="http://127.0.0.1:9") == "from-env"


def test_without_url_no_token_is_looked_up(monkeypatch, tmp_path):
    monkeypatch.setenv("IMDS_ADMIN_TOKEN", "from-env")
    assert _token(monkeypatch, tmp_path) is None


def test_a_remote_server_without_a_token_is_refused_naming_both_sources(monkeypatch):
    monkeypatch.setenv("IMDS_ADMIN_TOKEN", "ignored-here")  # the lab's server module reads no environment
    with pytest.raises(LabError, match="--admin-token or IMDS_ADMIN_TOKEN"):
        remote_server("http://127.0.0.1:9", None)
    assert remote_server("http://127.0.0.1:9/", "t").url == "http://127.0.0.1:9"
