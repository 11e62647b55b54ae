"""Server keys kept in the data directory: created once (mode 0600), then reused.

Replicas that must agree on a key (IMDSv2 tokens minted by one and checked by another;
one identity certificate) should be given the same file with the matching flag.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from imds.errors import ConfigError


def load_or_create(path: Path, create: Callable[[], bytes]) -> bytes:
    """The file's bytes; when it does not exist, ``create()`` them and write it 0600."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    except OSError as exc:
        msg = f"cannot read key file {path}: {exc.strerror}"
        raise ConfigError(msg) from exc
    data = create()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()  # another process created it first: use theirs
    except OSError as exc:
        msg = f"cannot create key file {path}: {exc.strerror}"
        raise ConfigError(msg) from exc
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return data


def read(path: Path, what: str) -> bytes:
    """A configured key or certificate file, or ConfigError naming it."""
    try:
        return path.read_bytes()
    except OSError as exc:
        msg = f"cannot read {what} {path}: {exc.strerror}"
        raise ConfigError(msg) from exc
