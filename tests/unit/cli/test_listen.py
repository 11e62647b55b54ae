"""The default listeners: 127.0.0.1 and ::1, the IPv6 one only where the host has an IPv6 loopback."""

from __future__ import annotations

from imds.cli.listen import has_ipv6_loopback, listen_addresses
from imds.config import load

BASE_ENV = {"HOME": "/nonexistent"}


def test_default_listens_on_both_loopbacks_when_ipv6_is_there():
    """With IPv6 loopback available the default binds 127.0.0.1:8000 and [::1]:8000 (what the demo promises)."""
    settings = load({}, BASE_ENV)
    assert listen_addresses(settings, ipv6_loopback=True) == (("127.0.0.1", 8000), ("::1", 8000))


def test_default_drops_ipv6_on_a_host_without_it():
    """Without IPv6 loopback the default still starts, on 127.0.0.1 only."""
    settings = load({}, BASE_ENV)
    assert listen_addresses(settings, ipv6_loopback=False) == (("127.0.0.1", 8000),)


def test_explicit_addresses_are_kept_as_given():
    """An address the operator asked for is never dropped, even ::1 without IPv6 (binding it then fails loudly)."""
    settings = load({"listen": ("[::1]:9000",)}, BASE_ENV)
    assert listen_addresses(settings, ipv6_loopback=False) == (("::1", 9000),)


def test_this_machine_has_ipv6_loopback():
    """The probe agrees with the machine (CI hosts have ::1; the tour's [::1] curl relies on it)."""
    assert has_ipv6_loopback() is True
