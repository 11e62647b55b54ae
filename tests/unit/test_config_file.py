"""The TOML config file layer: precedence flag > env > file > default, typed keys, unknown keys refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from imds.config import OPTIONS, effective, layered, load
from imds.errors import ConfigError


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "imds.toml"
    path.write_text(text)
    return path


def test_the_file_sets_options_and_flags_and_env_override_it(tmp_path):
    path = _file(tmp_path, 'log_level = "debug"\nlisten = ["127.0.0.1:9000"]\nmax_body_bytes = 2048\n'
                           'migrate = false\ntrusted-proxy = "10.0.0.0/8, 10.1.0.0/16"\n')
    settings = load({"config": str(path)}, {})
    assert (settings.logging.log_level, settings.limits.max_body_bytes) == ("debug", 2048)
    assert settings.http.listen == (("127.0.0.1", 9000),)
    assert settings.store.migrate is False
    assert [str(n) for n in settings.callers.trusted_proxy] == ["10.0.0.0/8", "10.1.0.0/16"]
    env = {"IMDS_CONFIG": str(path), "IMDS_LOG_LEVEL": "warning", "IMDS_MAX_BODY_BYTES": "4096"}
    sources = layered({"max_body_bytes": 8192}, env, OPTIONS)
    assert sources["max_body_bytes"] == (8192, "flag")
    assert sources["log_level"] == ("warning", "env")
    assert sources["listen"] == (("127.0.0.1:9000",), "file")
    assert sources["demo"] == (False, "default")


def test_an_unknown_key_names_the_key_and_the_file(tmp_path):
    path = _file(tmp_path, 'log_level = "info"\nlisten_address = "x"\n')
    with pytest.raises(ConfigError, match=rf"config file {path}: unknown key 'listen_address'"):
        load({}, {"IMDS_CONFIG": str(path)})


@pytest.mark.parametrize(("text", "message"), [
    ('max_body_bytes = "big"', "key 'max_body_bytes' must be an integer"),
    ("migrate = 1", "key 'migrate' must be true or false"),
    ("max_body_bytes = true", "key 'max_body_bytes' must be an integer"),
    ("listen = [1, 2]", "key 'listen' must be an array of strings"),
    ("log_level = ", "not valid TOML"),
])
def test_a_badly_typed_value_is_refused_with_its_key(tmp_path, text, message):
    path = _file(tmp_path, text + "\n")
    with pytest.raises(ConfigError, match=message):
        load({"config": str(path)}, {})


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"config file .*nope.toml \(--config / IMDS_CONFIG\): cannot read"):
        load({"config": str(tmp_path / "nope.toml")}, {})


def test_effective_masks_secrets_and_passwords_in_urls(tmp_path):
    path = _file(tmp_path, 'admin_token = "file-token"\nlookup_client_secret = "s3cret"\n'
                           'lookup_url = "https://upstream.example/"\nlookup_client_id = "imds"\n'
                           'lookup_oidc_issuer = "https://idp.example/"\n'
                           'db = "postgresql://imds:hunter2@db.example:5432/imds"\n')
    rows = {name: (value, source) for name, value, source in effective({"config": str(path)}, {})}
    assert rows["config"] == (str(path), "flag")
    assert rows["admin_token"] == ("********", "file")
    assert rows["lookup_client_secret"] == ("********", "file")
    assert "hunter2" not in rows["db"][0]
    assert rows["log_level"] == ("info", "default")
    assert not any("file-token" in value or "s3cret" in value for value, _ in rows.values())
