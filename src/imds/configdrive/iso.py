"""``{path: bytes}`` → an ISO 9660 image with Joliet and Rock Ridge, written by pycdlib.

Guests see the real names through Rock Ridge (Linux) or Joliet (Windows); the plain
ISO 9660 names underneath are the interchange-level-3 forms (upper case, ``_`` for any
other character, made unique per directory), as genisoimage would mangle them.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import BinaryIO

import pycdlib

_NOT_D_CHARACTER = re.compile(r"[^A-Z0-9_]")
_MAX_NAME = 30  # level 3: name + "." + extension, without the ";1" version
_MAX_DIR = 31


def _mangle(name: str, *, directory: bool, taken: set[str]) -> str:
    """An ISO 9660 level-3 name for ``name``, unique among ``taken`` (which it joins)."""
    stem, dot, ext = ("", "", "") if directory else name.rpartition(".")
    if directory or not dot or not stem:
        stem, ext = name, ""
    stem = _NOT_D_CHARACTER.sub("_", stem.upper()) or "_"
    ext = _NOT_D_CHARACTER.sub("_", ext.upper())
    limit = _MAX_DIR if directory else _MAX_NAME - len(ext) - 1
    candidate, counter = stem[:limit], 0
    while (candidate + (f".{ext}" if ext else "")) in taken:
        counter += 1
        suffix = f"_{counter}"
        candidate = stem[: limit - len(suffix)] + suffix
    mangled = candidate + (f".{ext}" if ext else "")
    taken.add(mangled)
    return mangled


def write_iso(files: Mapping[str, bytes], label: str, out: BinaryIO) -> None:
    """Write ``files`` (``a/b/c`` → bytes) as an ISO 9660 + Joliet + Rock Ridge image labelled ``label``."""
    iso = pycdlib.PyCdlib()
    iso.new(interchange_level=3, joliet=3, rock_ridge="1.09", vol_ident=label)
    try:
        iso_dirs: dict[str, str] = {"": ""}
        taken: dict[str, set[str]] = {}
        for path in sorted(files):
            parts = path.split("/")
            for depth in range(1, len(parts)):
                _add_directory(iso, "/".join(parts[:depth]), iso_dirs, taken)
            parent = "/".join(parts[:-1])
            name = _mangle(parts[-1], directory=False, taken=taken.setdefault(parent, set()))
            data = files[path]
            iso.add_fp(
                io.BytesIO(data), len(data), f"{iso_dirs[parent]}/{name};1", rr_name=parts[-1], joliet_path=f"/{path}",
            )
        iso.write_fp(out)
    finally:
        iso.close()


def _add_directory(iso: pycdlib.PyCdlib, path: str, iso_dirs: dict[str, str], taken: dict[str, set[str]]) -> None:
    if path in iso_dirs:
        return
    parent, _, name = path.rpartition("/")
    mangled = _mangle(name, directory=True, taken=taken.setdefault(parent, set()))
    iso_dirs[path] = f"{iso_dirs[parent]}/{mangled}"
    iso.add_directory(iso_dirs[path], rr_name=name, joliet_path=f"/{path}")


def iso_bytes(files: Mapping[str, bytes], label: str) -> bytes:
    """``write_iso`` into memory."""
    out = io.BytesIO()
    write_iso(files, label, out)
    return out.getvalue()


def list_iso(image: BinaryIO) -> tuple[str, list[tuple[str, int]]]:
    """The volume label and every file as (Rock Ridge path, size), for ``imds configdrive list``."""
    iso = pycdlib.PyCdlib()
    iso.open_fp(image)
    try:
        label = iso.pvd.volume_identifier.decode().rstrip()
        files = []
        for root, _dirs, names in iso.walk(rr_path="/"):
            for name in sorted(names):
                path = f"{root.rstrip('/')}/{name}"
                files.append((path, iso.get_record(rr_path=path).get_data_length()))
    finally:
        iso.close()
    return label, sorted(files)
