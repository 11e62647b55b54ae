"""IMDSv2 reads answered from the read memo: the key, the EC2 flavor's gate, and the answers in process (ASGI).

A read carrying one ``X-aws-ec2-metadata-token`` is recalled when the memo holds the
path's answer for the caller and the token is valid for that instance now; the answer is
the kept one with the token's TTL header first, as the whole way answers it. The clock is
injected (``build_app(clock=...)``), so a TTL and an expiry are exact. Each test counts how
often the EC2 flavor's read ran (a remembered read does not run it) and compares whole
answers (status, headers in order, body), so a memo answering something else fails here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest

from helpers import FakeClock, client_from, make_settings, push_record
from imds.app import build_app
from imds.services.catalog.catalog import Entry
from imds.services.identity.tokens import TokenIssuer
from imds.web.flavors.ec2 import TokenGate
from imds.web.instance import InstanceFront
from imds.web.memo import memo_key

pytestmark = pytest.mark.anyio
GUEST, OTHER = "10.83.0.9", "10.83.0.10"
GUEST_ID, OTHER_ID = "22222222-2222-4222-8222-222222222222", "33333333-3333-4333-8333-333333333333"
TOKEN, TTL = "X-aws-ec2-metadata-token", "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_B = TOKEN.lower().encode()
GATED = frozenset({TOKEN_B})
PATH = "/latest/meta-data/hostname"
HOST = (GUEST, 40000)


# -- the key -------------------------------------------------------------------------------------


def test_a_token_read_is_keyed_by_its_path_and_carries_its_token():
    """One token header (among inert ones) keys as the path alone, the token beside it."""
    headers = [(b"host", b"169.254.169.254"), (TOKEN_B, b"t0k"), (b"user-agent", b"Cloud-Init/22.4")]
    assert memo_key(PATH, headers, GATED) == (PATH, (TOKEN_B, b"t0k"))
    assert memo_key(PATH, [(b"accept", b"*/*")], GATED) == (PATH, None)
    assert memo_key(PATH, [(b"metadata-flavor", b"Google")], GATED) == (f"{PATH}\nGoogle", None)


@pytest.mark.parametrize("headers", [
    [(TOKEN_B, b"a"), (TOKEN_B, b"b")],  # two tokens: the flavor tries each (NTH's retry)
    [(TOKEN_B, b"a"), (b"metadata-flavor", b"Google")],
    [(b"metadata-flavor", b"Google"), (TOKEN_B, b"a")],
    [(TOKEN_B, b"a"), (b"if-none-match", b'"x"')],
    [(TOKEN_B, b"a"), (b"x-forwarded-for", b"10.0.0.1")],
])
def test_a_token_with_another_header_a_handler_reads_is_never_kept(headers):
    assert memo_key(PATH, headers, GATED) is None


def test_a_token_header_is_no_gated_header_unless_a_flavor_says_so():
    """Without the EC2 flavor's gate, the token header is one a handler reads, as before."""
    assert memo_key(PATH, [(TOKEN_B, b"a")]) is None


# -- the gate ------------------------------------------------------------------------------------


def _entry(instance_id: str) -> Entry:
    return cast("Entry", SimpleNamespace(id=instance_id, instance=SimpleNamespace(id=instance_id)))


def test_the_gate_admits_a_valid_token_of_the_instance_with_its_ttl_left():
    clock = FakeClock(5000.0)
    issuer = TokenIssuer(b"k" * 32, clock)
    gate = TokenGate(issuer, required=False)
    token = issuer.issue(GUEST_ID, 300).encode()
    assert gate.admit(token, _entry(GUEST_ID)) == ((TTL.lower().encode(), b"300"),)
    clock.advance(299)
    assert gate.admit(token, _entry(GUEST_ID)) == ((TTL.lower().encode(), b"1"),)
    clock.advance(1)
    assert gate.admit(token, _entry(GUEST_ID)) is None  # expired
    fresh = issuer.issue(GUEST_ID, 60).encode()
    assert gate.admit(fresh, _entry(OTHER_ID)) is None  # another instance's
    for bad in (fresh + b"x", b"", b"not-a-token", b"\xff\xfe"):
        assert gate.admit(bad, _entry(GUEST_ID)) is None, bad
    assert gate.admit(TokenIssuer(b"j" * 32, clock).issue(GUEST_ID, 60).encode(), _entry(GUEST_ID)) is None


def test_the_gate_admits_a_tokenless_read_only_when_tokens_are_optional():
    issuer = TokenIssuer(b"k" * 32, FakeClock())
    assert TokenGate(issuer, required=False).admit(None, _entry(GUEST_ID)) == ()
    assert TokenGate(issuer, required=True).admit(None, _entry(GUEST_ID)) is None


# -- in process ----------------------------------------------------------------------------------


@dataclass
class Fixture:
    app: InstanceFront
    clock: FakeClock
    reads: list[str]  # the paths the EC2 flavor's read ran for (the whole way)

    def client(self, source: str = GUEST) -> httpx.AsyncClient:
        return client_from(self.app, source)


@asynccontextmanager
async def _started(clock: FakeClock, **settings: Any) -> AsyncIterator[Fixture]:
    app = build_app(make_settings(**settings), clock=clock)
    async with app.services.running():
        await push_record(app, [GUEST], {"id": GUEST_ID, "hostname": "guest"})
        await push_record(app, [OTHER], {"id": OTHER_ID, "hostname": "other"})
        ec2 = app._ec2
        read = ec2._read
        reads: list[str] = []

        async def counted(call: Any, version: str, subpath: str) -> Any:
            reads.append(call.scope["path"])
            return await read(call, version, subpath)

        ec2._read = counted  # type: ignore[method-assign]
        yield Fixture(app, clock, reads)


@pytest.fixture
async def memo() -> AsyncIterator[Fixture]:
    """Two instances (GUEST, OTHER), --imdsv2 optional, a fake clock, the EC2 reads counted."""
    async with _started(FakeClock(1_800_000_000.0)) as running:
        yield running


async def _mint(client: httpx.AsyncClient, ttl: int = 300) -> str:
    answer = await client.put("/latest/api/token", headers={TTL: str(ttl)})
    assert answer.status_code == 200, answer.text
    return answer.text


def _whole(answer: httpx.Response) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """Status, raw headers in order and case, body."""
    return answer.status_code, list(answer.headers.raw), answer.content


async def test_a_repeated_token_read_is_the_same_answer_without_the_handler(memo):
    """Three token reads: the first runs the flavor, the others are recalled, byte for byte the same."""
    async with memo.client() as guest:
        token = await _mint(guest)
        answers = [_whole(await guest.get(PATH, headers={TOKEN: token})) for _ in range(3)]
    assert memo.reads == [PATH]
    assert answers[0] == answers[1] == answers[2]
    status, headers, body = answers[0]
    assert (status, body) == (200, b"guest")
    assert headers[0] == (TTL.lower().encode(), b"300")  # first, as the whole way puts it
    assert [name for name, _ in headers] == [TTL.lower().encode(), b"content-type", b"content-length", b"etag"]


async def test_an_answer_kept_for_a_tokenless_read_answers_a_token_read_and_back(memo):
    """The answer is the same document either way: kept for one, recalled for the other, TTL only with a token."""
    async with memo.client() as guest:
        token = await _mint(guest)
        plain = _whole(await guest.get(PATH))
        with_token = _whole(await guest.get(PATH, headers={TOKEN: token}))
        assert memo.reads == [PATH]
        assert with_token[1] == [(TTL.lower().encode(), b"300"), *plain[1]]
        assert (with_token[0], with_token[2]) == (plain[0], plain[2])
        other = "/latest/meta-data/instance-id"
        first = _whole(await guest.get(other, headers={TOKEN: token}))
        tokenless = _whole(await guest.get(other))
    assert memo.reads == [PATH, other]
    assert (first[0], first[2]) == (200, GUEST_ID.encode())
    assert tokenless == (first[0], first[1][1:], first[2])


async def test_the_ttl_counts_down_on_remembered_reads(memo):
    async with memo.client() as guest:
        token = await _mint(guest, ttl=120)
        lefts = []
        for step in (0, 7, 100, 12):
            memo.clock.advance(step)
            answer = await guest.get(PATH, headers={TOKEN: token})
            assert (answer.status_code, answer.text) == (200, "guest")
            lefts.append(answer.headers[TTL])
    assert lefts == ["120", "113", "13", "1"]
    assert memo.reads == [PATH]


async def test_bad_tokens_are_401_after_the_path_is_remembered(memo):
    """Expired, another instance's, forged, from another key: the whole way answers each (401), nothing kept."""
    async with memo.client() as guest, memo.client(OTHER) as other:
        token = await _mint(guest, ttl=60)
        others = await _mint(other)
        assert (await guest.get(PATH, headers={TOKEN: token})).text == "guest"
        assert (await guest.get(PATH, headers={TOKEN: token})).text == "guest"
        assert memo.reads == [PATH]
        forged = TokenIssuer(b"x" * 32, memo.clock).issue(GUEST_ID, 60)
        for bad in (others, token + "x", forged, "garbage"):
            answer = await guest.get(PATH, headers={TOKEN: bad})
            assert (answer.status_code, answer.text) == (401, "401 - Unauthorized"), bad
            assert TTL.lower() not in answer.headers
        assert len(memo.reads) == 5  # each bad one went the whole way
        memo.clock.advance(60)
        expired = await guest.get(PATH, headers={TOKEN: token})
        assert (expired.status_code, expired.text) == (401, "401 - Unauthorized")
        assert len(memo.reads) == 6
        fresh = await _mint(guest)
        assert (await guest.get(PATH, headers={TOKEN: fresh})).headers[TTL] == "300"
        assert len(memo.reads) == 6  # still remembered: only the token changed


async def test_two_token_headers_go_the_whole_way(memo):
    """NTH's retry carries the stale token and the new one: the flavor answers it, every time."""
    async with memo.client() as guest:
        token = await _mint(guest)
        await guest.get(PATH, headers={TOKEN: token})
        both = [("X-aws-ec2-metadata-token", "stale"), ("X-aws-ec2-metadata-token", token)]
        for _ in range(2):
            answer = await guest.get(PATH, headers=both)
            assert (answer.status_code, answer.text, answer.headers[TTL]) == (200, "guest", "300")
    assert memo.reads == [PATH, PATH, PATH]


async def test_a_token_read_on_another_flavor_is_never_recalled(memo):
    """An OpenStack answer has no gate: a token there goes the whole way (the flavor ignores it) as before."""
    path = "/openstack/latest/meta_data.json"
    async with memo.client() as guest:
        token = await _mint(guest)
        await guest.get(path)
        assert memo.app.remembered(HOST, path, "GET", []) is not None
        assert memo.app.remembered(HOST, path, "GET", [(TOKEN_B, token.encode())]) is None
        assert (await guest.get(path, headers={TOKEN: token})).json()["uuid"] == GUEST_ID


async def test_remembered_token_reads_are_counted(memo):
    """Hollow's metadata hits and the instance tally count every token read, the recalled ones too."""
    tally = memo.app.services.metrics.tally
    reads, statuses = tally.reads, tally.group("instance").statuses
    async with memo.client() as guest:
        token = await _mint(guest)
        hits, ok = reads[("metadata", True)], statuses.get(200, 0)
        for _ in range(4):
            assert (await guest.get(PATH, headers={TOKEN: token})).status_code == 200
        assert (await guest.get(PATH, headers={TOKEN: "bad"})).status_code == 401
    assert memo.reads == [PATH, PATH]
    assert reads[("metadata", True)] - hits == 4  # a 401 is no hit, on the whole way as before
    assert statuses.get(200, 0) - ok == 4
    assert statuses[401] >= 1


async def test_again_checks_the_token_each_time_and_says_its_ttl(memo):
    """The front's repeat (``InstanceFront.again``): the same token read is answered again while the token lives."""
    async with memo.client() as guest:
        token = await _mint(guest, ttl=30)
        await guest.get(PATH, headers={TOKEN: token})
    headers = [(b"host", b"169.254.169.254"), (TOKEN_B, token.encode())]
    found = memo.app.remembered(HOST, PATH, "GET", headers)
    assert found is not None
    assert (found.headers[0], found.body) == ((TTL.lower().encode(), b"30"), b"guest")
    found.wire = "encoded"
    assert memo.app.again(HOST, PATH, found)
    assert found.wire == "encoded"  # nothing changed: the server's encoding still holds
    memo.clock.advance(10)
    assert memo.app.again(HOST, PATH, found)
    assert (found.headers[0], found.wire) == ((TTL.lower().encode(), b"20"), None)
    assert not memo.app.again((OTHER, 1), PATH, found)  # another caller
    memo.clock.advance(20)
    assert not memo.app.again(HOST, PATH, found)  # expired
    assert memo.reads == [PATH]


async def test_required_mode_never_recalls_a_token_answer_without_a_token():
    """--imdsv2 required: token reads are recalled, a tokenless one stays 401 however often the path was read."""
    async with _started(FakeClock(1_800_000_000.0), imdsv2="required") as running, running.client() as guest:
        token = await _mint(guest)
        for _ in range(2):
            assert (await guest.get(PATH, headers={TOKEN: token})).text == "guest"
        assert running.reads == [PATH]
        assert running.app.remembered(HOST, PATH, "GET", []) is None
        refused = await guest.get(PATH)
        assert (refused.status_code, refused.text) == (401, "401 - Unauthorized")
        assert running.reads == [PATH, PATH]


async def test_a_trusted_proxy_peer_goes_the_whole_way():
    """A peer inside --trusted-proxy names its callers by headers: never recalled, token or not."""
    async with _started(FakeClock(1_800_000_000.0), trusted_proxy=(ipaddress.ip_network("10.83.0.0/28"),)) as running:
        token = running.app.services.tokens.issue(GUEST_ID, 300)
        async with running.client() as proxy:
            for _ in range(2):
                assert (await proxy.get(PATH, headers={TOKEN: token})).text == "guest"
        assert running.app.remembered(HOST, PATH, "GET", [(TOKEN_B, token.encode())]) is None
        assert running.reads == [PATH, PATH]
