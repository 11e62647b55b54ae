"""--ganeti-os-search-path: Ganeti's own search path by default; each OS from the first directory that has it."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

from ganeti_metad import CLIENT_LIB, SYSTEM_PYTHON, require_ganeti
from imds.config import Settings
from imds.errors import ConfigError
from imds.services.ganeti.definitions import OsDefinitions


def definition(root: Path, name: str, create: str = "#!/bin/sh\n", *, broken: bool = False) -> None:
    """``root/name`` in Ganeti's layout (``broken``: without ``export``)."""
    directory = root / name
    directory.mkdir(parents=True)
    for script in ("create", "import", "rename", *(() if broken else ("export",))):
        (directory / script).write_text(create if script == "create" else "#!/bin/sh\n")
    (directory / "ganeti_api_version").write_text("20\n")


def test_the_default_is_ganetis_search_path():
    """The default is Debian's Ganeti 3.0 constants.OS_SEARCH_PATH, in its order."""
    require_ganeti()
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from ganeti import _constants; "
            "print(_constants.OS_SEARCH_PATH)")
    done = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", code, str(CLIENT_LIB)], capture_output=True, text=True,
                          timeout=60, check=True)
    ganeti = ast.literal_eval(done.stdout.strip())
    assert [str(path) for path in Settings.of().ganeti.ganeti_os_search_path] == ganeti
    assert ganeti == ["/srv/ganeti/os", "/usr/local/lib/ganeti/os", "/usr/lib/ganeti/os", "/usr/share/ganeti/os"]


def test_the_first_directory_holding_a_name_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Missing directories are skipped; a broken OS is skipped with a warning and hides the same name further down."""
    first, missing, last = tmp_path / "srv", tmp_path / "nowhere", tmp_path / "usr"
    definition(first, "debootstrap", "#!/bin/sh\necho first\n")
    definition(last, "debootstrap", "#!/bin/sh\necho last\n")
    definition(first, "image", broken=True)
    definition(last, "image")
    definition(last, "only-last")
    found = OsDefinitions.load(None, (first, missing, last))
    assert found.names() == ["debootstrap", "only-last"]
    debootstrap = found.get("debootstrap")
    assert debootstrap is not None
    assert debootstrap.scripts["create"] == b"#!/bin/sh\necho first\n"
    logged = capsys.readouterr().out
    assert "os_definitions.skipped" in logged
    assert "missing export" in logged


def test_an_explicit_directory_replaces_the_search_path_and_stays_strict(tmp_path: Path):
    """--os-definitions-dir: only that directory; a broken definition there stops the start (ConfigError)."""
    chosen, searched = tmp_path / "chosen", tmp_path / "searched"
    definition(chosen, "tiny")
    definition(searched, "other")
    assert OsDefinitions.load(chosen, (searched,)).names() == ["tiny"]
    definition(chosen, "broken", broken=True)
    with pytest.raises(ConfigError, match="missing export"):
        OsDefinitions.load(chosen, (searched,))
    assert OsDefinitions.load(None, ()).names() == []
