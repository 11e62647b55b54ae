"""OpenStack's ``random_seed``: 512 fresh random bytes per ``meta_data.json`` read, as base64 text.

Nova draws ``os.urandom(512)`` per request. On a 2-core box the kernel's ``getrandom`` gives
about 250 MB/s (262 µs per 64 KiB, 2 µs per seed), a tenth of a remembered read's cost.
``SeedPool`` draws a 256-bit key from the kernel per pool and expands it with ChaCha20
(``cryptography``, i.e. OpenSSL: 64 KiB in ~30 µs): the construction of the kernel's own
CSPRNG and of OpenBSD's ``arc4random``. A pool's key is dropped when the pool is made; no
byte is handed out twice.
"""

from __future__ import annotations

import binascii
import os

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

SEED_BYTES = 512  # Nova's random_seed: 512 random bytes, base64
POOL_BYTES = 64 << 10  # keystream made at once: 128 seeds
_KEY_BYTES = 32
_NONCE = bytes(16)  # ChaCha20's block counter and nonce: zero, as every pool has a key of its own


def keystream(key: bytes, count: int) -> bytes:
    """``count`` bytes of the ChaCha20 keystream under ``key`` (counter and nonce zero)."""
    return Cipher(algorithms.ChaCha20(key, _NONCE), mode=None).encryptor().update(bytes(count))


class SeedPool:
    """Fresh random seeds (see the module docstring); used from one thread (the event loop's)."""

    def __init__(self, size: int = POOL_BYTES) -> None:
        self._size = max(size, SEED_BYTES)
        self._pool = b""
        self._at = 0

    def take(self) -> bytes:
        """The base64 text (no newline) of ``SEED_BYTES`` random bytes never handed out before."""
        at = self._at
        if at + SEED_BYTES > len(self._pool):
            self._pool, at = keystream(os.urandom(_KEY_BYTES), self._size), 0
        self._at = at + SEED_BYTES
        return binascii.b2a_base64(self._pool[at : at + SEED_BYTES], newline=False)
