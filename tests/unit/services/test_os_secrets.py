"""Secret values never show: repr, str, format, pickling, and the parsed write that carries them."""

from __future__ import annotations

import pickle

import pytest

from imds.errors import InvalidInput
from imds.services.ganeti.memory import Held, PackageAuth, Secret, SecretVault
from imds.services.ganeti.wire import parse_os_write

ID = "3f2504e0-4f89-11d3-9a0c-0305e82c3301"


def test_a_secret_never_shows_itself():
    """repr, str, f-strings and containers show <secret>; reveal() is the only way to the value; pickling fails."""
    secret = Secret("hunter2")
    for shown in (repr(secret), str(secret), f"{secret}", f"{secret!r}", repr([secret]), repr({"k": secret})):
        assert "hunter2" not in shown
        assert "<secret>" in shown
    assert secret.reveal() == "hunter2"
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(secret)
    assert "hunter2" not in repr(Held("g", {("parameters", "p"): secret}, PackageAuth(Secret("u"), Secret("hunter2"))))


def test_the_parsed_write_hides_private_and_secret_values():
    """The OsWrite repr shows public values only."""
    write = parse_os_write({
        "id": ID, "os_type": "tiny", "mode": "install",
        "parameters": {"a": {"value": "shown-value"}, "b": {"value": "priv-value", "visibility": "private"},
                       "c": {"value": "sec-value", "visibility": "secret"}},
        "package": {"url": "http://192.0.2.1/p.tgz", "username": "user-value", "password": "pass-value"},
    }, max_value_bytes=100)
    shown = repr(write)
    assert "shown-value" in shown
    for hidden in ("priv-value", "sec-value", "user-value", "pass-value"):
        assert hidden not in shown


def test_invalid_input_never_carries_a_value():
    """Every problem of a bad body names fields; no value appears in the error or its problems."""
    with pytest.raises(InvalidInput) as caught:
        parse_os_write({
            "id": "sec-value-as-id", "os_type": "sec-value os", "mode": "sec-value",
            "parameters": {"b": {"value": "sec-value" * 50, "visibility": "secret"},
                           "c": {"value": "sec-value", "visibility": "sec-value"}},
            "package": {"url": "http://sec-value:sec-value@h/p.tgz"},
        }, max_value_bytes=100)
    text = repr(caught.value.problems) + str(caught.value)
    assert "sec-value" not in text
    assert {p.field for p in caught.value.problems} == {
        "id", "os_type", "mode", "parameters.b.value", "parameters.c.visibility", "package.url",
    }


def test_the_vault_serves_only_the_current_generation():
    """A held secret is returned for its own generation only; restore undoes keep; drop forgets."""
    vault = SecretVault()
    first = Held("g1", {("parameters", "p"): Secret("one")})
    assert vault.keep("i", first) is None
    assert vault.current("i", "g1") is first
    assert vault.current("i", "g2") is None
    previous = vault.keep("i", Held("g2"))
    vault.restore("i", previous)
    assert vault.current("i", "g1") is first
    vault.drop("i")
    assert vault.current("i", "g1") is None
    assert "one" not in repr(vault)
