"""Ganeti OS definitions loaded from a directory with Ganeti's OS layout.

``--os-definitions-dir DIR`` (or, without it, every directory of ``--ganeti-os-search-path``,
Ganeti's own search path by default): each subdirectory ``DIR/<name>`` is one OS, as on a Ganeti
node's OS search path: the scripts ``create``, ``export``, ``import``, ``rename`` (and
``verify``), ``ganeti_api_version`` (one integer per line) and ``parameters.list``
(``NAME description`` per line). Every replica reads the same files at startup, as every
Ganeti node has the same OS directories. Each definition's install package (the whole
directory as a tar.gz) is built in memory once; nothing is written to disk.
"""

from __future__ import annotations

import gzip
import io
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path

from imds import log
from imds.errors import ConfigError

_log = log.get("os-definitions")
SCRIPTS = ("create", "export", "import", "rename", "verify")
REQUIRED = ("create", "export", "import", "rename", "ganeti_api_version")
PARAMETERS_LIST = "parameters.list"
API_VERSION = "ganeti_api_version"
MAX_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class OsDefinition:
    """One OS: its scripts, declared parameters, API versions and its tar.gz."""

    name: str
    scripts: dict[str, bytes]
    parameters: dict[str, str]  # name → description
    api_versions: tuple[int, ...]
    package: bytes  # the OS definition directory as a tar.gz (the os-install-package)

    def summary(self) -> dict[str, object]:
        """What the admin API shows about it."""
        return {
            "name": self.name,
            "scripts": sorted(self.scripts),
            "parameters": self.parameters,
            "api_versions": list(self.api_versions),
            "package_bytes": len(self.package),
        }


class OsDefinitions:
    """The definitions by name (empty when no directory is configured)."""

    def __init__(self, definitions: dict[str, OsDefinition] | None = None) -> None:
        self._by_name = dict(definitions or {})

    @classmethod
    def load(cls, root: Path | None, search_path: tuple[Path, ...] = ()) -> OsDefinitions:
        """Every OS under ``root`` (ConfigError names the first broken one); without ``root``, the search path."""
        if root is None:
            return cls.search(search_path)
        if not root.is_dir():
            msg = f"--os-definitions-dir / IMDS_OS_DEFINITIONS_DIR: {root} is not a directory"
            raise ConfigError(msg)
        found = {d.name: load_definition(d) for d in _definition_dirs(root)}
        _log.info("os_definitions.loaded", directory=str(root), names=sorted(found))
        return cls(found)

    @classmethod
    def search(cls, search_path: tuple[Path, ...]) -> OsDefinitions:
        """Ganeti's way: each OS name from the first directory of ``search_path`` that has it.

        A directory that is missing is skipped; a broken definition is skipped with a warning
        (and hides the same name further down the path, as on a Ganeti node).
        """
        found: dict[str, OsDefinition] = {}
        seen: set[str] = set()
        for directory in search_path:
            try:
                paths = _definition_dirs(directory) if directory.is_dir() else []
            except OSError as exc:
                _log.warning("os_definitions.unreadable", directory=str(directory), problem=exc.strerror or str(exc))
                continue
            for path in paths:
                if path.name in seen:
                    continue
                seen.add(path.name)
                try:
                    found[path.name] = load_definition(path)
                except (ConfigError, OSError) as exc:
                    problem = exc.message if isinstance(exc, ConfigError) else f"{path}: {exc.strerror or exc}"
                    _log.warning("os_definitions.skipped", name=path.name, problem=problem)
        if search_path:
            _log.info("os_definitions.loaded", search_path=[str(d) for d in search_path], names=sorted(found))
        return cls(found)

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        """Every loaded OS name, sorted."""
        return sorted(self._by_name)

    def get(self, os_type: str) -> OsDefinition | None:
        """The definition for an OS type; ``name+variant`` uses ``name``'s (Ganeti's variants)."""
        return self._by_name.get(os_type) or self._by_name.get(os_type.split("+", 1)[0])


def _definition_dirs(root: Path) -> list[Path]:
    """The OS directories under ``root`` (links to directories are not part of Ganeti's layout here)."""
    return [d for d in sorted(root.iterdir()) if d.is_dir() and not d.is_symlink()]


def load_definition(directory: Path) -> OsDefinition:
    """One OS directory; ConfigError when a required file is missing or unreadable."""
    where = f"OS definition {directory}"
    files: dict[str, tuple[bytes, int]] = {}
    for path in sorted(directory.iterdir()):
        mode = path.lstat().st_mode
        if not stat.S_ISREG(mode):
            continue  # links and subdirectories are not part of Ganeti's layout; skipping them keeps the tree closed
        if path.stat().st_size > MAX_FILE_BYTES:
            msg = f"{where}: {path.name} is larger than {MAX_FILE_BYTES} bytes"
            raise ConfigError(msg)
        files[path.name] = (path.read_bytes(), stat.S_IMODE(mode))
    if missing := [name for name in REQUIRED if name not in files]:
        msg = f"{where}: missing {', '.join(missing)} (Ganeti's OS layout)"
        raise ConfigError(msg)
    try:
        versions = tuple(int(line) for line in files[API_VERSION][0].decode().split() if line)
    except (UnicodeDecodeError, ValueError) as exc:
        msg = f"{where}: {API_VERSION} must hold integers, one per line"
        raise ConfigError(msg) from exc
    parameters: dict[str, str] = {}
    if PARAMETERS_LIST in files:
        for line in files[PARAMETERS_LIST][0].decode(errors="replace").splitlines():
            name, _, description = line.strip().partition(" ")
            if name:
                parameters[name] = description.strip()
    return OsDefinition(
        name=directory.name,
        scripts={name: files[name][0] for name in SCRIPTS if name in files},
        parameters=parameters,
        api_versions=versions,
        package=_tar_gz(directory.name, files),
    )


def _tar_gz(name: str, files: dict[str, tuple[bytes, int]]) -> bytes:
    """``name/<file>`` for each file, built in memory, byte-for-byte reproducible (mtime 0)."""
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zipped, tarfile.open(fileobj=zipped, mode="w") as tar:
        directory = tarfile.TarInfo(name)
        directory.type, directory.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(directory)
        for filename, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(f"{name}/{filename}")
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()
