"""``imds proxy``'s settings: flags, IMDS_PROXY_* variables, defaults and errors naming the flag."""

from __future__ import annotations

from pathlib import Path

import pytest

from imds.config import PROXY_OPTIONS, load_proxy
from imds.errors import ConfigError

BASE = {"IMDS_PROXY_UPSTREAM": "http://10.0.0.2:8000", "IMDS_PROXY_SHARED_SECRET_FILE": "/s",
        "IMDS_PROXY_MAP": "/m"}


def test_environment_and_defaults():
    settings = load_proxy({}, BASE)
    assert settings.upstream == "http://10.0.0.2:8000"
    assert (settings.shared_secret_file, settings.map) == (Path("/s"), Path("/m"))
    assert settings.listen == (("169.254.169.254", 80),)
    assert (settings.timeout, settings.connect_timeout, settings.max_connections) == (5.0, 2.0, 64)


def test_flags_win_and_listen_takes_ipv6_with_a_zone():
    flags = {"listen": ("[fe80::a9fe:a9fe%eth0]:80", "169.254.169.254:80"), "timeout": 1.5}
    settings = load_proxy(flags, {**BASE, "IMDS_PROXY_TIMEOUT": "9"})
    assert settings.listen == (("fe80::a9fe:a9fe%eth0", 80), ("169.254.169.254", 80))
    assert settings.timeout == 1.5


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"IMDS_PROXY_UPSTREAM": "10.0.0.2:8000"}, "--upstream"),
        ({"IMDS_PROXY_UPSTREAM": "ftp://imds:8443"}, "--upstream"),
        ({"IMDS_PROXY_SHARED_SECRET_FILE": ""}, "--host-key-file"),
        ({"IMDS_PROXY_HOST_KEY_FILE": "/k", "IMDS_PROXY_HOST_NAME": "compute-1"}, "exactly one of"),
        ({"IMDS_PROXY_SHARED_SECRET_FILE": "", "IMDS_PROXY_HOST_KEY_FILE": "/k"}, "--host-name"),
        ({"IMDS_PROXY_HOST_NAME": "compute-1"}, "--host-name .* only used with --host-key-file"),
        ({"IMDS_PROXY_UPSTREAM_CA_FILE": "/etc/hostname"}, "--upstream-ca-file .* needs an https://"),
        ({"IMDS_PROXY_UPSTREAM_INSECURE": "1"}, "--upstream-insecure .* needs an https://"),
        ({"IMDS_PROXY_UPSTREAM": "https://imds:8443", "IMDS_PROXY_UPSTREAM_CA_FILE": "/nonexistent"},
         "--upstream-ca-file .* is not a file"),
        ({"IMDS_PROXY_UPSTREAM": "https://imds:8443", "IMDS_PROXY_UPSTREAM_KEY_FILE": "/etc/hostname"},
         "--upstream-key-file .* needs --upstream-cert-file"),
        ({"IMDS_PROXY_MAP": ""}, "--map"),
        ({"IMDS_PROXY_TIMEOUT": "0"}, "--timeout"),
        ({"IMDS_PROXY_MAP_POLL_INTERVAL": "-1"}, "--map-poll-interval"),
        ({"IMDS_PROXY_LOG_LEVEL": "loud"}, "--log-level"),
    ],
)
def test_errors_name_the_flag(change, named):
    with pytest.raises(ConfigError, match=named):
        load_proxy({}, {**BASE, **change})


def test_every_proxy_variable_is_namespaced():
    assert all(option.env.startswith("IMDS_PROXY_") for option in PROXY_OPTIONS)


def test_watch_max_timeout_defaults_to_serves_and_must_be_positive():
    assert load_proxy({}, BASE).watch_max_timeout == 300
    assert load_proxy({}, {**BASE, "IMDS_PROXY_WATCH_MAX_TIMEOUT": "60"}).watch_max_timeout == 60
    with pytest.raises(ConfigError, match="watch-max-timeout"):
        load_proxy({"watch_max_timeout": 0}, BASE)


def test_https_upstream_with_a_host_key_and_tls_files():
    """A host's own key with its name, an https:// upstream, a private CA and a client certificate."""
    env = {**BASE, "IMDS_PROXY_SHARED_SECRET_FILE": "", "IMDS_PROXY_HOST_KEY_FILE": "/k",
           "IMDS_PROXY_HOST_NAME": "compute-1", "IMDS_PROXY_UPSTREAM": "https://imds.internal:8443",
           "IMDS_PROXY_UPSTREAM_CA_FILE": "/etc/hostname", "IMDS_PROXY_UPSTREAM_CERT_FILE": "/etc/hostname"}
    settings = load_proxy({}, env)
    assert (settings.host_key_file, settings.host_name, settings.shared_secret_file) == (Path("/k"), "compute-1", None)
    assert settings.upstream_ca_file == Path("/etc/hostname")
    assert settings.upstream_key_file is None
    assert settings.upstream_insecure is False
