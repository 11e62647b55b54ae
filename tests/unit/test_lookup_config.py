"""Pull-mode settings: the lookup_* options from flags and environment, and every refusal names its flags."""

from __future__ import annotations

import re

import pytest

from imds.config import load
from imds.errors import ConfigError

BASE_ENV = {"HOME": "/home/someone"}
OAUTH_FLAGS = "--lookup-oidc-issuer, --lookup-client-id and --lookup-client-secret"
OAUTH_VARS = "(IMDS_LOOKUP_OIDC_ISSUER, IMDS_LOOKUP_CLIENT_ID, IMDS_LOOKUP_CLIENT_SECRET)"
ISSUER = "https://login.example/realms/fleet"


def refused(flags: dict[str, object] | None = None, **environ: str) -> str:
    with pytest.raises(ConfigError) as raised:
        load(flags or {}, {**BASE_ENV, **environ})
    return raised.value.message


def test_pull_mode_is_off_by_default_with_the_documented_policy():
    """No --lookup-url: no upstream; the policy defaults are those of the README."""
    up = load({}, BASE_ENV).lookup
    assert up.lookup_url is None
    assert (up.lookup_token, up.lookup_oidc_issuer, up.lookup_scope) == (None, None, ())
    assert (up.lookup_timeout, up.lookup_negative_ttl, up.lookup_refresh_after) == (2.0, 30.0, 0.0)
    assert (up.lookup_cache_ttl, up.lookup_concurrency) == (300.0, 16)
    assert (up.lookup_breaker_failures, up.lookup_breaker_reset) == (5, 10.0)


def test_every_lookup_option_from_the_environment():
    """IMDS_LOOKUP_* set each option; scopes are comma-separated."""
    up = load({}, {
        **BASE_ENV,
        "IMDS_LOOKUP_URL": "https://source.example/api/",
        "IMDS_LOOKUP_OIDC_ISSUER": ISSUER,
        "IMDS_LOOKUP_CLIENT_ID": "imds",
        "IMDS_LOOKUP_CLIENT_SECRET": "s3cret",
        "IMDS_LOOKUP_SCOPES": "metadata:read, userdata:read",
        "IMDS_LOOKUP_AUDIENCE": "source",
        "IMDS_LOOKUP_TIMEOUT": "0.5",
        "IMDS_LOOKUP_NEGATIVE_TTL": "5",
        "IMDS_LOOKUP_REFRESH_AFTER": "60",
        "IMDS_LOOKUP_CACHE_TTL": "120",
        "IMDS_LOOKUP_CONCURRENCY": "4",
        "IMDS_LOOKUP_BREAKER_FAILURES": "3",
        "IMDS_LOOKUP_BREAKER_RESET": "1.5",
    }).lookup
    assert up.lookup_url == "https://source.example/api/"
    assert (up.lookup_oidc_issuer, up.lookup_client_id, up.lookup_client_secret) == (
        ISSUER, "imds", "s3cret",
    )
    assert up.lookup_scope == ("metadata:read", "userdata:read")
    assert up.lookup_audience == "source"
    assert (up.lookup_timeout, up.lookup_negative_ttl, up.lookup_refresh_after) == (0.5, 5.0, 60.0)
    assert (up.lookup_cache_ttl, up.lookup_concurrency) == (120.0, 4)
    assert (up.lookup_breaker_failures, up.lookup_breaker_reset) == (3, 1.5)


def test_flags_win_over_the_environment():
    """--lookup-url and repeated --lookup-scope override IMDS_LOOKUP_URL / IMDS_LOOKUP_SCOPES."""
    settings = load(
        {"lookup_url": "http://flag.example", "lookup_scope": ("a", "b"), "lookup_token": "t"},
        {**BASE_ENV, "IMDS_LOOKUP_URL": "http://env.example", "IMDS_LOOKUP_SCOPES": "c"},
    )
    assert settings.lookup.lookup_url == "http://flag.example"
    assert (settings.lookup.lookup_scope, settings.lookup.lookup_token) == (("a", "b"), "t")


def test_secrets_stay_out_of_the_settings_repr():
    """Neither the static token nor the client secret shows in repr(Settings)."""
    settings = load({"lookup_url": "http://u.example", "lookup_token": "tok-canary-1"}, BASE_ENV)
    assert "tok-canary-1" not in repr(settings)
    settings = load({
        "lookup_url": "http://u.example", "lookup_oidc_issuer": ISSUER,
        "lookup_client_id": "imds", "lookup_client_secret": "secret-canary-2",
    }, BASE_ENV)
    assert "secret-canary-2" not in repr(settings)


@pytest.mark.parametrize("url", ["ftp://source.example", "source.example:8080", "file:///etc/passwd", "HTTP:/x"])
def test_a_lookup_url_that_is_not_http_is_refused(url):
    """Only http:// and https:// upstreams; the message names the flag, the variable and the value."""
    message = refused({"lookup_url": url})
    assert message == f"--lookup-url / IMDS_LOOKUP_URL: {url!r} is not an http:// or https:// URL"
    assert refused(IMDS_LOOKUP_URL=url) == message


@pytest.mark.parametrize(
    "given",
    [
        {"lookup_oidc_issuer": ISSUER},
        {"lookup_client_id": "imds"},
        {"lookup_client_secret": "s"},
        {"lookup_oidc_issuer": ISSUER, "lookup_client_id": "imds"},
        {"lookup_client_id": "imds", "lookup_client_secret": "s"},
    ],
)
def test_partial_client_credentials_are_refused_naming_all_three(given):
    """Issuer, client id and secret go together; the message names every flag and variable."""
    message = refused({"lookup_url": "https://u.example", **given})
    assert message == f"{OAUTH_FLAGS} {OAUTH_VARS} go together"


def test_a_static_token_and_client_credentials_exclude_each_other():
    """--lookup-token with OAuth2 client credentials is refused, naming both."""
    message = refused(
        {"lookup_url": "https://u.example", "lookup_token": "t"},
        IMDS_LOOKUP_OIDC_ISSUER=ISSUER, IMDS_LOOKUP_CLIENT_ID="imds", IMDS_LOOKUP_CLIENT_SECRET="s",
    )
    assert message == "--lookup-token / IMDS_LOOKUP_TOKEN and OAuth2 client credentials exclude each other"


@pytest.mark.parametrize(
    ("env_var", "value", "message"),
    [
        ("IMDS_LOOKUP_TIMEOUT", "0", "--lookup-timeout / IMDS_LOOKUP_TIMEOUT must be positive"),
        ("IMDS_LOOKUP_NEGATIVE_TTL", "-1", "--lookup-negative-ttl / IMDS_LOOKUP_NEGATIVE_TTL must be positive"),
        ("IMDS_LOOKUP_CACHE_TTL", "0", "--lookup-cache-ttl / IMDS_LOOKUP_CACHE_TTL must be positive"),
        ("IMDS_LOOKUP_BREAKER_RESET", "0", "--lookup-breaker-reset / IMDS_LOOKUP_BREAKER_RESET must be positive"),
        ("IMDS_LOOKUP_CONCURRENCY", "0", "--lookup-concurrency / IMDS_LOOKUP_CONCURRENCY must be at least 1"),
        ("IMDS_LOOKUP_BREAKER_FAILURES", "0",
         "--lookup-breaker-failures / IMDS_LOOKUP_BREAKER_FAILURES must be at least 1"),
        ("IMDS_LOOKUP_REFRESH_AFTER", "-0.5",
         "--lookup-refresh-after / IMDS_LOOKUP_REFRESH_AFTER must be 0 (off) or positive"),
        ("IMDS_LOOKUP_TIMEOUT", "soon", "IMDS_LOOKUP_TIMEOUT / --lookup-timeout: 'soon' is not a valid float"),
        ("IMDS_LOOKUP_CONCURRENCY", "2.5",
         "IMDS_LOOKUP_CONCURRENCY / --lookup-concurrency: '2.5' is not a valid int"),
    ],
)
def test_out_of_range_policy_values_are_refused_by_name(env_var, value, message):
    """Timeouts, TTLs and limits outside their range fail at startup with the flag and variable named."""
    assert refused(**{env_var: value}) == message


def test_refresh_after_zero_means_off():
    """IMDS_LOOKUP_REFRESH_AFTER=0 is accepted (background refresh off)."""
    assert load({}, {**BASE_ENV, "IMDS_LOOKUP_REFRESH_AFTER": "0"}).lookup.lookup_refresh_after == 0.0


def test_messages_never_contain_the_secret():
    """A refusal caused by credentials does not echo the secret or the token."""
    message = refused({"lookup_token": "tok-canary-3", "lookup_client_secret": "secret-canary-4"})
    assert not re.search("canary", message)
