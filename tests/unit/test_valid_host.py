"""A host name ends where it ends: a trailing newline or control character is not a host."""

from __future__ import annotations

import pytest

from imds.signing import valid_host


@pytest.mark.parametrize("name", ["node1", "hv-12.rack3.example", "a", "h_1"])
def test_a_dns_like_name_is_a_host(name):
    assert valid_host(name)


@pytest.mark.parametrize("name", ["node1\n", "node1\r", "", "-node", "no de", "n" * 254, "node1\x00"])
def test_anything_else_is_not(name):
    assert not valid_host(name)
