"""``Bounded.untouched``: the requests the limits would hand on as they are (what the front may answer itself)."""

from __future__ import annotations

import pytest

from helpers import make_settings
from imds.web.bounded import Bounded


async def _app(_scope, _receive, _send) -> None:
    return None


BOUNDED = Bounded(_app, make_settings(max_headers=3))


@pytest.mark.parametrize(("headers", "untouched"), [
    ([(b"host", b"imds")], True),
    ([(b"host", b"imds"), (b"content-length", b"0")], True),
    ([(b"host", b"imds"), (b"content-length", b"5")], False),  # a body: timed by the wrapper
    ([(b"content-length", b"0"), (b"content-length", b"0")], False),  # repeated: refused as ambiguous
    ([(b"transfer-encoding", b"chunked")], False),
    ([(b"x-a", b"1"), (b"x-b", b"1"), (b"x-c", b"1")], True),
    ([(b"x-a", b"1"), (b"x-b", b"1"), (b"x-c", b"1"), (b"x-d", b"1")], False),  # over --max-headers: 431
], ids=["plain", "empty-body", "body", "two-lengths", "chunked", "at-the-limit", "over-the-limit"])
def test_untouched_is_exactly_what_the_wrapper_passes_through(headers, untouched):
    """No refusal and no body to time: untouched; anything the wrapper acts on: not."""
    assert BOUNDED.untouched(headers) is untouched
