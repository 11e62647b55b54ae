"""Reading ISO images back in tests, with pycdlib: every file by its Rock Ridge or Joliet path, and the label."""

from __future__ import annotations

import io
from pathlib import Path

import pycdlib


def _open(data: bytes) -> pycdlib.PyCdlib:
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(data))
    return iso


def read_iso(data: bytes, *, names: str = "rr") -> dict[str, bytes]:
    """Every file in the image, keyed by its path without a leading slash, as Rock Ridge (``rr``) or Joliet names."""
    iso = _open(data)
    files: dict[str, bytes] = {}
    try:
        for root, _dirs, found in iso.walk(**{f"{names}_path": "/"}):
            for name in found:
                path = f"{root.rstrip('/')}/{name}"
                out = io.BytesIO()
                iso.get_file_from_iso_fp(out, **{f"{names}_path": path})
                files[path.lstrip("/")] = out.getvalue()
    finally:
        iso.close()
    return files


def volume_label(data: bytes) -> str:
    """The primary volume identifier, trailing blanks stripped."""
    iso = _open(data)
    try:
        return iso.pvd.volume_identifier.decode().rstrip()
    finally:
        iso.close()


def extract(data: bytes, into: Path) -> Path:
    """Write every file (Rock Ridge names) under ``into``, as a mounted drive would show them."""
    for path, content in read_iso(data).items():
        target = into / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    return into
