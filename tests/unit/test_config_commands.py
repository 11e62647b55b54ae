"""``--config`` / ``IMDS_CONFIG`` on ``imds proxy`` and ``imds agent``, through the CLI: flag > env > file > default.

Each command runs as far as the settings it would serve with: ``imds proxy``'s ``run`` and
``imds agent``'s ``Agent`` are replaced by stand-ins that keep what they were given.
"""

from __future__ import annotations

import importlib
import json
import signal
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import imds.agent.loop
from imds import log
from imds.cli import cli

# ``imds.cli.proxy`` the attribute is the click command; the module is what ``run`` lives in.
PROXY_CLI = importlib.import_module("imds.cli.proxy")


class FakeAgent:
    """Stands in for ``imds.agent.loop.Agent``: keeps its settings, runs at once."""

    seen: list[Any]

    def __init__(self, settings: Any, _secret: bytes) -> None:
        FakeAgent.seen.append(settings)

    def run(self) -> None:
        """Return at once (the real one programs OVS and runs haproxy)."""


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The settings each command started with; logging and SIGTERM are left as they are."""
    seen: list[Any] = []
    FakeAgent.seen = seen
    monkeypatch.setattr(PROXY_CLI, "run", seen.append)
    monkeypatch.setattr(imds.agent.loop, "Agent", FakeAgent)
    monkeypatch.setattr(log, "configure", lambda _level: None)
    monkeypatch.setattr(signal, "signal", lambda *_args: None)
    return seen


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_text("s" * 32)
    return path


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "imds.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _invoke(*args: str, **env: str) -> Any:
    return CliRunner().invoke(cli, list(args), env={"IMDS_CONFIG": None, **env}, catch_exceptions=False)


def test_proxy_reads_its_options_from_the_file(tmp_path, secret, started):
    path = _toml(tmp_path, f'upstream = "http://10.0.0.2:8000"\nshared_secret_file = "{secret}"\n'
                           f'map = "{tmp_path / "map"}"\ntimeout = 1.5\n[proxy]\nmax_connections = 7\n')
    done = _invoke("proxy", "--config", str(path))
    assert done.exit_code == 0, done.output
    (settings,) = started
    assert (settings.upstream, settings.timeout, settings.max_connections) == ("http://10.0.0.2:8000", 1.5, 7)
    assert settings.shared_secret_file == secret


def test_proxy_flag_and_environment_beat_the_file(tmp_path, secret, started):
    path = _toml(tmp_path, f'upstream = "http://10.0.0.2:8000"\nshared_secret_file = "{secret}"\n'
                           f'map = "{tmp_path / "map"}"\ntimeout = 1.5\nconnect_timeout = 1.0\n')
    done = _invoke("proxy", "--timeout", "3", IMDS_CONFIG=str(path), IMDS_PROXY_CONNECT_TIMEOUT="4")
    assert done.exit_code == 0, done.output
    (settings,) = started
    assert (settings.timeout, settings.connect_timeout) == (3.0, 4.0)


def test_agent_reads_its_options_from_the_file(tmp_path, secret, started):
    path = _toml(tmp_path, f'upstream = "http://127.0.0.1:8000"\nshared_secret_file = "{secret}"\n'
                           'provider_vlan_id = 42\nmode = "inport"\n')
    done = _invoke("agent", "--config", str(path))
    assert done.exit_code == 0, done.output
    (settings,) = started
    assert (settings.upstream, settings.provider_vlan_id, settings.mode) == ("http://127.0.0.1:8000", 42, "inport")


def test_agent_flag_and_environment_beat_the_file(tmp_path, secret, started):
    path = _toml(tmp_path, f'upstream = "http://127.0.0.1:8000"\nshared_secret_file = "{secret}"\n'
                           'provider_vlan_id = 42\nmode = "inport"\n')
    done = _invoke("agent", "--mode", "haproxy", IMDS_CONFIG=str(path), IMDS_AGENT_PROVIDER_VLAN_ID="7")
    assert done.exit_code == 0, done.output
    (settings,) = started
    assert (settings.mode, settings.provider_vlan_id) == ("haproxy", 7)


@pytest.mark.parametrize(("command", "wrong", "message"), [
    ("proxy", 'timeout = "soon"', "key 'timeout' must be a number"),
    ("agent", 'provider_vlan_id = "998"', "key 'provider_vlan_id' must be an integer"),
])
def test_an_unknown_key_or_a_wrong_type_is_a_usage_error_naming_it(tmp_path, started, command, wrong, message):
    path = _toml(tmp_path, "listen_on = 1\n")
    done = _invoke(command, "--config", str(path))
    assert done.exit_code == 2
    assert f"config file {path}: unknown key 'listen_on'" in done.output
    path.write_text(wrong + "\n")
    done = _invoke(command, "--config", str(path))
    assert done.exit_code == 2
    assert f"config file {path}: {message}" in done.output
    assert started == []


def test_config_show_proxy_and_agent_list_values_with_their_source(tmp_path, secret):
    path = _toml(tmp_path, f'upstream = "http://10.0.0.2:8000"\nshared_secret_file = "{secret}"\n'
                           f'map = "{tmp_path / "map"}"\ntimeout = 1.5\n')
    done = _invoke("config", "show-proxy", "--config", str(path), "--max-connections", "9", "-o", "json",
                   IMDS_PROXY_CONNECT_TIMEOUT="4")
    assert done.exit_code == 0, done.output
    rows = {row["name"]: (row["value"], row["source"]) for row in json.loads(done.output)}
    assert rows["config"] == (str(path), "flag")
    assert rows["timeout"] == ("1.5", "file")
    assert rows["max_connections"] == ("9", "flag")
    assert rows["connect_timeout"] == ("4.0", "env")
    assert rows["log_level"] == ("info", "default")
    agent_file = _toml(tmp_path, f'upstream = "http://127.0.0.1:8000"\nshared_secret_file = "{secret}"\n')
    shown = _invoke("config", "show-agent", IMDS_CONFIG=str(agent_file))
    assert shown.exit_code == 0, shown.output
    assert any(line.split()[:3] == ["upstream", "file", "http://127.0.0.1:8000"] for line in shown.output.splitlines())
