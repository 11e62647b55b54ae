"""The one IMDSv2 token-PUT rule: which headers say "relayed", which paths are the token path."""

from __future__ import annotations

import urllib.parse

import pytest

from imds.services.identity.tokens import FORWARDING_HEADERS, TOKEN_PATH, forwarding, is_token_path
from token_put_cases import FORWARDING, FORWARDING_NAMES, OTHER_PATHS, TOKEN_PATHS


def test_the_forwarding_headers_are_the_ones_the_rule_names():
    """One constant, every header of the rule (serve, imds proxy and the agent's haproxy read it)."""
    assert sorted(FORWARDING_HEADERS) == sorted(name.lower() for name in FORWARDING_NAMES)


@pytest.mark.parametrize(("name", "value"), FORWARDING)
def test_each_forwarding_header_counts_whatever_its_value(name, value):
    """ASGI lower-cases names; an empty value and any X-Forwarded-* count too."""
    assert forwarding([(b"host", b"imds"), (name.lower().encode(), value.encode())])


def test_other_headers_do_not_count():
    """Identity headers, tokens and look-alikes are not forwarding headers."""
    headers = [(b"x-instance-id", b"i"), (b"x-aws-ec2-metadata-token-ttl-seconds", b"60"), (b"x-forwarded", b"x"),
               (b"forwarded-for", b"x"), (b"x-real-ip-address", b"x"), (b"via", b"1.1 relay")]
    assert not forwarding(headers)


@pytest.mark.parametrize("path", TOKEN_PATHS)
def test_the_token_path_as_serve_decodes_it(path):
    """Slashes around ``api/token``, escaped letters and a query are still the token path."""
    assert is_token_path(urllib.parse.unquote(path.partition("?")[0]))


@pytest.mark.parametrize("path", [*OTHER_PATHS, "/latest/api/token\n", "/latest/api/tokens", "/latest/api/token/x",
                                  "/latest/./api/token", "/2021-03-23/api/token", "/latest", "/latestapi/token"])
def test_other_paths_are_not_the_token_path(path):
    """Case variants, a leading '//', other versions and longer paths are not it."""
    assert not is_token_path(path)
    assert is_token_path(TOKEN_PATH)
