"""The typed request context and the entry's change-watch API."""

from __future__ import annotations

import asyncio

import pytest

from imds.models import Instance
from imds.services.catalog.entry import Entry, RenderCache
from imds.store.interface import stored_form
from imds.web.routing import UNKNOWN, InstanceCall


def test_the_request_context_is_slotted_and_starts_empty():
    """One small object per request: no __dict__, nothing resolved until the Locator fills it in."""
    scope = {"method": "GET", "path": "/metadata", "headers": []}
    call = InstanceCall(scope)
    assert not hasattr(call, "__dict__")
    assert call.scope is scope
    assert (call.entry, call.claim, call.address) == (None, UNKNOWN, UNKNOWN)
    assert (call.versioned, call.version) == (False, None)
    with pytest.raises(AttributeError):
        call.anything = 1  # type: ignore[attr-defined]


def _entry() -> Entry:
    return Entry(stored_form(Instance("11111111-2222-3333-4444-555555555555")), RenderCache(1 << 20))


def test_a_found_entry_versions_the_reply_until_a_handler_says_it_is_no_document():
    """``found`` makes the reply a version of the entry (its ETag, its watch); ``unversioned`` says it is not."""
    call = InstanceCall({"method": "GET", "path": "/", "headers": []})
    entry = _entry()
    call.found(entry)
    assert call.version is entry
    call.unversioned()  # a message, a token, an error: no ETag, no watch
    assert call.version is None
    assert call.entry is entry  # the caller is still known
    call.found(entry)  # a rerun (the change watch) looks the caller up again
    assert call.version is entry


@pytest.mark.anyio
async def test_watch_holds_a_waiter_until_wake_and_unwatch_lets_it_go():
    """``wake`` resolves what ``watch`` holds; an ``unwatch``ed waiter is not held any more."""
    entry = Entry(stored_form(Instance("11111111-2222-3333-4444-555555555555")), RenderCache(1 << 20))
    loop = asyncio.get_running_loop()
    kept, left = loop.create_future(), loop.create_future()
    entry.watch(kept)
    entry.watch(left)
    entry.unwatch(left)
    assert entry.waiters == {kept}
    entry.wake()
    assert kept.done()
    assert not left.done()
    assert entry.waiters is None
    entry.unwatch(left)  # nothing held: a no-op
    assert entry.waiters is None
