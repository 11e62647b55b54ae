"""OpenStack's random_seed pool: ChaCha20 keystream under a kernel key per pool, base64, never handed out twice."""

from __future__ import annotations

import base64

from imds.services.render.seeds import SEED_BYTES, SeedPool, keystream

# RFC 8439 appendix A.1, test vector #1: the block function with an all-zero key, nonce and counter.
RFC8439_ZERO_BLOCK = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586")


def test_the_keystream_is_rfc_8439_chacha20():
    """Counter and nonce zero: the RFC's first block, and a different key gives different bytes."""
    assert keystream(bytes(32), 64) == RFC8439_ZERO_BLOCK
    assert keystream(bytes(31) + b"\x01", 64) != RFC8439_ZERO_BLOCK


def test_seeds_are_consecutive_keystream_slices_under_one_kernel_key_per_pool(monkeypatch):
    """Each pool is keyed by a fresh os.urandom(32); seeds are its consecutive 512-byte slices, base64."""
    keys: list[bytes] = []

    def fake_urandom(count: int) -> bytes:
        keys.append(bytes([len(keys) + 1]) * count)
        return keys[-1]

    monkeypatch.setattr("imds.services.render.seeds.os.urandom", fake_urandom)
    pool = SeedPool(size=1200)  # two seeds per pool, 176 bytes left unused each time
    seeds = [pool.take() for _ in range(5)]
    assert [len(key) for key in keys] == [32, 32, 32]
    expected = [keystream(keys[n // 2], 1200)[(n % 2) * SEED_BYTES : (n % 2 + 1) * SEED_BYTES] for n in range(5)]
    assert [base64.b64decode(seed, validate=True) for seed in seeds] == expected
    assert len(set(seeds)) == 5


def test_seeds_from_the_kernel_are_canonical_base64_of_512_bytes_and_all_differ():
    """Across pools (300 seeds, 128 per pool): each decodes strictly to 512 bytes, re-encodes the same, none repeats."""
    pool = SeedPool()
    seeds = [pool.take() for _ in range(300)]
    decoded = [base64.b64decode(seed, validate=True) for seed in seeds]
    assert {len(raw) for raw in decoded} == {SEED_BYTES}
    assert [base64.b64encode(raw) for raw in decoded] == seeds
    assert len(set(decoded)) == 300
    assert b"\n" not in b"".join(seeds)
