"""Settings: flag > environment > default, parsing of each kind, and secrets kept out of repr."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from imds.config import OPTIONS, Settings, load, parse_listen
from imds.errors import ConfigError

BASE_ENV = {"HOME": "/home/someone"}
ANY4 = "0.0.0.0"  # noqa: S104 - parsed, never bound


def env(**values: str) -> dict[str, str]:
    return {**BASE_ENV, **values}


def test_defaults_without_flags_or_environment():
    """With nothing given, every option takes its documented default."""
    settings = load({}, BASE_ENV)
    assert settings.http.listen == (("127.0.0.1", 8000), ("::1", 8000))
    assert settings.callers.trusted_proxy == ()
    assert settings.store.migrate is True
    assert settings.store.demo is False
    assert settings.limits.max_body_bytes == 1024 * 1024
    assert settings.logging.log_level == "info"
    assert settings.admin.admin_token is None
    assert settings.templates.sources == {}
    assert settings.store.feed_poll_interval == 1.0
    assert settings.http.shutdown_timeout == 10.0


def test_default_database_is_sqlite_under_home_local_share():
    """Without XDG_DATA_HOME, the data dir is ~/.local/share/imds and the DB a file in it."""
    settings = load({}, BASE_ENV)
    assert settings.store.data_dir == Path("/home/someone/.local/share/imds")
    assert settings.store.db == "sqlite:////home/someone/.local/share/imds/imds.db"


def test_default_database_follows_xdg_data_home():
    """XDG_DATA_HOME moves the default data dir."""
    settings = load({}, env(XDG_DATA_HOME="/srv/xdg"))
    assert settings.store.data_dir == Path("/srv/xdg/imds")
    assert settings.store.db == "sqlite:////srv/xdg/imds/imds.db"


def test_data_dir_moves_the_default_database(tmp_path):
    """--data-dir / IMDS_DATA_DIR place the SQLite file."""
    assert load({"data_dir": str(tmp_path)}, BASE_ENV).store.db == f"sqlite:///{tmp_path / 'imds.db'}"
    assert load({}, env(IMDS_DATA_DIR=str(tmp_path))).store.db == f"sqlite:///{tmp_path / 'imds.db'}"


def test_explicit_db_url_wins_over_the_data_dir(tmp_path):
    """IMDS_DB replaces the default file; the data dir is still resolved."""
    settings = load({"data_dir": str(tmp_path)}, env(IMDS_DB="memory://"))
    assert settings.store.db == "memory://"
    assert settings.store.data_dir == tmp_path


def test_flag_beats_environment_beats_default():
    """A flag overrides the environment, which overrides the default."""
    environment = env(IMDS_LOG_LEVEL="warning", IMDS_MAX_BODY_BYTES="2048")
    assert load({}, environment).logging.log_level == "warning"
    assert load({"log_level": "debug"}, environment).logging.log_level == "debug"
    assert load({}, environment).limits.max_body_bytes == 2048
    assert load({"max_body_bytes": 4096}, environment).limits.max_body_bytes == 4096
    assert load({"log_level": None, "max_body_bytes": None}, environment).limits.max_body_bytes == 2048


def test_empty_list_flag_means_not_given():
    """An unused repeatable flag (empty tuple) falls through to the environment."""
    settings = load({"listen": ()}, env(IMDS_LISTEN=f"{ANY4}:9000"))
    assert settings.http.listen == ((ANY4, 9000),)


def test_list_flag_beats_list_environment():
    """Repeated --listen replaces IMDS_LISTEN entirely."""
    settings = load({"listen": ("127.0.0.1:1", "[::1]:2")}, env(IMDS_LISTEN="0.0.0.0:9000"))
    assert settings.http.listen == (("127.0.0.1", 1), ("::1", 2))


def test_list_environment_is_comma_separated_with_blanks_ignored():
    """``a, b,,`` is two entries, trimmed."""
    settings = load({}, env(IMDS_TRUSTED_PROXIES=" 192.0.2.0/24 ,, 2001:db8::/32 ,", IMDS_LISTEN=f"[::]:80,{ANY4}:80"))
    networks = (ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("2001:db8::/32"))
    assert settings.callers.trusted_proxy == networks
    assert settings.http.listen == (("::", 80), (ANY4, 80))


def test_trusted_proxy_host_bits_are_cleared():
    """``192.0.2.7/24`` means the network 192.0.2.0/24."""
    assert load({"trusted_proxy": ("192.0.2.7/24", "10.0.0.1")}, BASE_ENV).callers.trusted_proxy == (
        ipaddress.ip_network("192.0.2.0/24"),
        ipaddress.ip_network("10.0.0.1/32"),
    )


@pytest.mark.parametrize("text", ["1", "true", "TRUE", "yes", "on", " On "])
def test_true_booleans(text):
    """Common spellings of true, any case, are true."""
    assert load({}, env(IMDS_DEMO=text)).store.demo is True


@pytest.mark.parametrize("text", ["0", "false", "False", "no", "off", ""])
def test_false_booleans(text):
    """Common spellings of false, and empty, are false."""
    assert load({}, env(IMDS_MIGRATE=text)).store.migrate is False


def test_bool_flag_beats_environment():
    """--no-migrate (False) is a given value, not "not given"."""
    assert load({"migrate": False}, env(IMDS_MIGRATE="1")).store.migrate is False
    assert load({"demo": True}, env(IMDS_DEMO="0")).store.demo is True


@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [
        ("IMDS_DEMO", "maybe", "--demo"),
        ("IMDS_MIGRATE", "2", "--migrate"),
        ("IMDS_MAX_BODY_BYTES", "1MB", "--max-body-bytes"),
        ("IMDS_FEED_POLL_INTERVAL", "fast", "--feed-poll-interval"),
        ("IMDS_SHUTDOWN_TIMEOUT", "10s", "--shutdown-timeout"),
        ("IMDS_LOG_INSTANCE_READS", "sometimes", "--log-instance-reads"),
    ],
)
def test_unparseable_environment_values_name_the_variable_and_the_flag(variable, value, flag):
    """The error says which variable and which flag, and quotes the value."""
    with pytest.raises(ConfigError) as caught:
        load({}, env(**{variable: value}))
    assert variable in caught.value.message
    assert flag in caught.value.message
    assert repr(value) in caught.value.message


@pytest.mark.parametrize(
    ("flags", "environment", "needles"),
    [
        ({"listen": ("nonsense",)}, {}, ("--listen", "IMDS_LISTEN", "'nonsense'")),
        ({}, {"IMDS_LISTEN": "127.0.0.1:99999"}, ("--listen", "IMDS_LISTEN")),
        ({"listen": (":8000",)}, {}, ("--listen", "IMDS_LISTEN", "no host")),
        ({"listen": ("[::1]:",)}, {}, ("--listen", "IMDS_LISTEN")),
        ({"trusted_proxy": ("10.0.0.0/33",)}, {}, ("--trusted-proxy", "IMDS_TRUSTED_PROXIES", "'10.0.0.0/33'")),
        ({}, {"IMDS_TRUSTED_PROXIES": "10.0.0.0/8,bogus"}, ("--trusted-proxy", "IMDS_TRUSTED_PROXIES", "'bogus'")),
        ({"log_level": "loud"}, {}, ("--log-level", "IMDS_LOG_LEVEL", "'loud'")),
        ({"max_body_bytes": 0}, {}, ("--max-body-bytes", "IMDS_MAX_BODY_BYTES")),
        ({}, {"IMDS_MAX_BODY_BYTES": "-5"}, ("--max-body-bytes", "IMDS_MAX_BODY_BYTES")),
        ({"db": "mysql://u:hunter2@h/db"}, {}, ("--db", "IMDS_DB", "mysql://u:***@h/db")),
        ({"admin_tokens_file": "/nonexistent/tokens.json"}, {}, ("--admin-tokens-file", "IMDS_ADMIN_TOKENS_FILE")),
        ({"event_rate": 0.0}, {}, ("--event-rate", "IMDS_EVENT_RATE", "positive")),
        ({}, {"IMDS_WATCH_MAX_TIMEOUT": "0"}, ("--watch-max-timeout", "IMDS_WATCH_MAX_TIMEOUT")),
        ({}, {"IMDS_MESSAGE_MAX_QUEUED": "-1"}, ("--message-max-queued", "IMDS_MESSAGE_MAX_QUEUED")),
        ({"ganeti_metad_socket": "/run/imds/metad.sock", "workers": 2}, {},
         ("--ganeti-metad-socket", "IMDS_GANETI_METAD_SOCKET", "use --workers 1")),
        ({}, {"IMDS_GANETI_METAD_SOCKET": "/run/imds/metad.sock", "IMDS_WORKERS": "3"},
         ("--ganeti-metad-socket", "one process")),
    ],
)
def test_invalid_values_are_config_errors_naming_flag_and_variable(flags, environment, needles):
    """Each invalid setting is refused with a message naming its flag and environment variable."""
    with pytest.raises(ConfigError) as caught:
        load(flags, env(**environment))
    for needle in needles:
        assert needle in caught.value.message
    assert "hunter2" not in caught.value.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        (f"{ANY4}:0", (ANY4, 0)),
        ("[::1]:8080", ("::1", 8080)),
        ("[::]:80", ("::", 80)),
        ("localhost:80", ("localhost", 80)),
    ],
)
def test_parse_listen(text, expected):
    """HOST:PORT and [V6]:PORT give (host, port)."""
    assert parse_listen(text) == expected


def test_log_level_is_case_insensitive():
    """``WARNING`` is stored as ``warning``."""
    assert load({}, env(IMDS_LOG_LEVEL="WARNING")).logging.log_level == "warning"


def test_template_fields_come_from_flags_and_environment():
    """Only configured template fields appear in ``templates.sources`` (and, compiled, in ``templates.compiled``)."""
    settings = load({"api_url": "https://{{.facility}}.example"}, env(IMDS_USER_STATE_URL="https://state/{{.id}}"))
    expected = {"api_url": "https://{{.facility}}.example", "user_state_url": "https://state/{{.id}}"}
    assert settings.templates.sources == expected
    assert [template.key for template in settings.templates.compiled] == ["api_url", "user_state_url"]


def test_empty_string_environment_means_unset_for_strings():
    """``IMDS_ADMIN_TOKEN=`` does not configure an empty token."""
    assert load({}, env(IMDS_ADMIN_TOKEN="")).admin.admin_token is None


def test_path_options_expand_the_home_directory(monkeypatch):
    """``~`` in a path option is expanded."""
    monkeypatch.setenv("HOME", "/home/someone")
    assert load({}, env(IMDS_DATA_DIR="~/imds")).store.data_dir == Path("/home/someone/imds")


def test_load_reads_os_environ_by_default(monkeypatch):
    """Without an explicit mapping, the process environment is read."""
    monkeypatch.setenv("IMDS_LOG_LEVEL", "error")
    assert load().logging.log_level == "error"


def test_repr_never_shows_the_admin_token_or_a_database_password():
    """Settings can end up in a traceback or a log line; secrets must not."""
    settings = load(
        {"admin_token": "s3cr3t-token-value", "db": "postgresql://imds:hunter2@db.example:5432/imds"}, BASE_ENV
    )
    for text in (repr(settings), str(settings), f"{settings}", f"{settings!r}"):
        assert "s3cr3t-token-value" not in text
        assert "hunter2" not in text
    assert "admin_token=<set>" in repr(settings)
    assert "postgresql://imds:***@db.example:5432/imds" in repr(settings)
    assert settings.admin.admin_token == "s3cr3t-token-value"


def test_repr_without_secrets_says_so():
    """No token shows as None; a URL without credentials is shown as is."""
    text = repr(Settings.of(db="sqlite:////tmp/x.db"))
    assert "admin_token=None" in text
    assert "sqlite:////tmp/x.db" in text


def test_every_option_has_a_flag_and_an_imds_env_var():
    """The table drives both the CLI and the environment; names follow one pattern."""
    for option in OPTIONS:
        assert option.env.startswith("IMDS_")
        assert option.flag == "--" + option.name.replace("_", "-")
        assert option.help
    assert "admin_token" in [o.name for o in OPTIONS if o.secret]
