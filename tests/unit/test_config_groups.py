"""Grouped settings: rows and group fields stay equal; groups are built by name; ``[group]`` tables in the file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from imds.config import AGENT_OPTIONS, OPTIONS, PROXY_OPTIONS, SETTINGS_GROUPS, Settings, groups, load
from imds.errors import ConfigError

TABLES = {"serve": OPTIONS, "proxy": PROXY_OPTIONS, "agent": AGENT_OPTIONS}
BASE_ENV = {"HOME": "/nonexistent"}


@pytest.mark.parametrize("table", TABLES.values(), ids=TABLES.keys())
def test_every_row_is_exactly_one_field_of_its_group_and_every_field_a_row(table):
    """Adding an option is one row plus one field: a row without its field (or the reverse) fails here."""
    by_group: dict[str, set[str]] = {}
    for option in table:
        assert option.group in groups(), f"{option.name}: no group {option.group!r}"
        assert option.name not in by_group.get(option.group, set()), f"{option.name} twice in {option.group}"
        by_group.setdefault(option.group, set()).add(option.name)
    for name, names in by_group.items():
        assert {f.name for f in dataclasses.fields(groups()[name])} == names, name


def test_settings_holds_every_serve_group_once():
    """``Settings``' fields are the groups ``OPTIONS`` names, each a group dataclass."""
    assert set(SETTINGS_GROUPS) == {option.group for option in OPTIONS}
    assert [f.name for f in dataclasses.fields(Settings)] == list(SETTINGS_GROUPS)


def test_group_names_are_not_option_names():
    """``settings.<group>.<option>`` is unambiguous (and the flat-to-grouped rewrite is idempotent)."""
    option_names = {option.name for table in TABLES.values() for option in table}
    assert not set(groups()) & option_names


def test_load_fills_each_group_by_option_name(tmp_path):
    """A flag, a variable and a default land in their groups' fields, converted to the field's type."""
    settings = load({"max_body_bytes": 2048, "trusted_proxy": ("10.0.0.0/8",)},
                    {**BASE_ENV, "IMDS_LOOKUP_TIMEOUT": "3", "IMDS_DATA_DIR": str(tmp_path)})
    assert settings.limits.max_body_bytes == 2048
    assert [str(n) for n in settings.callers.trusted_proxy] == ["10.0.0.0/8"]
    assert settings.lookup.lookup_timeout == 3.0
    assert isinstance(settings.lookup.lookup_timeout, float)
    assert settings.store.db == f"sqlite:///{tmp_path / 'imds.db'}"
    assert settings.store.key_dir == tmp_path
    assert settings.channel.event_burst == 10


def test_settings_of_takes_option_names_and_refuses_others():
    """``Settings.of`` (tests, embedding): defaults, an in-memory store, overrides by option name."""
    settings = Settings.of(max_addresses=7, rate_limit=0.0)
    assert (settings.limits.max_addresses, settings.callers.rate_limit) == (7, 0.0)
    assert settings.store.db == "memory://"
    assert settings.store.key_dir is None
    assert settings.http.listen == (("127.0.0.1", 8000), ("::1", 8000))
    with pytest.raises(TypeError, match="no_such_option"):
        Settings.of(no_such_option=1)


def test_a_bad_template_is_refused_at_load_naming_its_flag():
    """Template fields compile in ``load`` (the CLI no longer checks them itself)."""
    with pytest.raises(ConfigError, match=r"--api-url / IMDS_API_URL: template for api_url: only"):
        load({"api_url": "https://{{ if .x }}"}, BASE_ENV)
    assert [t.key for t in load({"api_url": "https://{{.facility}}"}, BASE_ENV).templates.compiled] == ["api_url"]


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "imds.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_config_file_accepts_group_tables_beside_flat_keys(tmp_path):
    """``[limits] max_body_bytes = …`` is the same as the flat ``max_body_bytes = …``."""
    text = 'log_level = "debug"\n[limits]\nmax_body_bytes = 4096\n[http]\nlisten = ["127.0.0.1:9001"]\n'
    path = _file(tmp_path, text)
    settings = load({"config": path}, BASE_ENV)
    assert settings.limits.max_body_bytes == 4096
    assert settings.http.listen == (("127.0.0.1", 9001),)
    assert settings.logging.log_level == "debug"


def test_config_file_refuses_an_option_in_the_wrong_group_table(tmp_path):
    """A key under a table must belong to that group; the error names the key as written."""
    path = _file(tmp_path, "[http]\nmax_body_bytes = 4096\n")
    with pytest.raises(ConfigError, match=r"unknown key 'http\.max_body_bytes'"):
        load({"config": path}, BASE_ENV)


def test_config_file_refuses_a_quoted_dotted_key(tmp_path):
    """``"limits.max_body_bytes" = …`` is one flat key (TOML quotes keep the dot), not an option name."""
    path = _file(tmp_path, '"limits.max_body_bytes" = 4096\n')
    with pytest.raises(ConfigError, match=r"unknown key 'limits\.max_body_bytes'"):
        load({"config": path}, BASE_ENV)
