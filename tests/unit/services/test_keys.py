"""Key files created once in the data directory, also when several workers start at once."""

from __future__ import annotations

import threading

from imds.services.identity.keys import load_or_create


def test_concurrent_creators_all_get_the_one_key_on_disk(tmp_path):
    """Eight starters racing on a fresh data dir: every one returns the bytes that ended up in the file."""
    path = tmp_path / "data" / "imdsv2.key"
    barrier = threading.Barrier(8)
    results: dict[int, bytes] = {}

    def start(n: int) -> None:
        barrier.wait()
        results[n] = load_or_create(path, lambda: f"key-of-{n}-".encode() * 64)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    on_disk = path.read_bytes()
    assert on_disk.startswith(b"key-of-")
    assert set(results.values()) == {on_disk}
    assert path.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in path.parent.iterdir()) == ["imdsv2.key"]  # no temporary files left


def test_an_existing_key_is_reused(tmp_path):
    """A second start reads the key instead of creating another."""
    path = tmp_path / "identity-key.pem"
    first = load_or_create(path, lambda: b"first")
    assert load_or_create(path, lambda: b"second") == first == b"first"
