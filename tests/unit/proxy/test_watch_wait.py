"""How long ``imds proxy`` lets a change watch be held on top of ``--timeout`` (serve's reading of the query)."""

from __future__ import annotations

import pytest

from imds.proxy.forward import watch_wait


@pytest.mark.parametrize(
    ("query", "wait"),
    [
        (b"", 0),
        (b"recursive=true", 0),
        (b"wait_for_change=false&timeout_sec=30", 0),
        (b"wait_for_change=true&wait_for_change=false", 0),  # the last one decides, as in serve
        (b"wait_for_change=true", 300),  # no timeout_sec: the maximum, serve's default
        (b"wait_for_change=1&timeout_sec=30", 30),
        (b"wait_for_change=TRUE&last_etag=abc&timeout_sec=7", 7),
        (b"wait_for_change=true&timeout_sec=9999", 300),  # never more than the maximum
        (b"wait_for_change=true&timeout_sec=abc", 300),  # serve answers 400 at once; never more either
    ],
)
def test_watch_wait(query: bytes, wait: int) -> None:
    assert watch_wait(query, 300) == wait
