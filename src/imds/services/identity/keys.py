"""Server keys kept in the data directory: created once (mode 0600, the directory 0700 when made here), then reused.

Replicas that must agree on a key (IMDSv2 tokens minted by one and checked by another;
one identity certificate) should be given the same file with the matching flag.
"""

from __future__ import annotations

import os
import tempfile
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
    # Written to a private temporary file, then linked into place: a second process (another
    # --workers worker, a replica on the same data dir) sees no file or the whole key, never
    # a half-written one; if it linked first, its key wins and this one is discarded.
    scratch: Path | None = None
    try:
        if not path.parent.exists():
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # mode 0600
        scratch = Path(name)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(scratch, path)
    except FileExistsError:
        return path.read_bytes()  # another process created it first: use theirs
    except OSError as exc:
        msg = f"cannot create key file {path}: {exc.strerror}"
        raise ConfigError(msg) from exc
    finally:
        if scratch is not None:
            scratch.unlink(missing_ok=True)
    return data


def read(path: Path, what: str) -> bytes:
    """A configured key or certificate file, or ConfigError naming it."""
    try:
        return path.read_bytes()
    except OSError as exc:
        msg = f"cannot read {what} {path}: {exc.strerror}"
        raise ConfigError(msg) from exc
