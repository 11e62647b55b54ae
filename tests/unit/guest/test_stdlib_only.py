"""``imds.guest`` imports nothing but the standard library and itself, so it runs on an image's python."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import imds.guest

PACKAGE = Path(imds.guest.__file__).parent
SHARED = ("imds.tarball",)  # the leaves the guest shares with the service (stdlib only themselves)


def _imports(path: Path) -> list[str]:
    """Every absolute module name a file imports, at any depth (functions included)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            # ``from imds import tarball`` imports the module imds.tarball
            names += [f"imds.{alias.name}" for alias in node.names] if node.module == "imds" else [str(node.module)]
    return names


def test_package_has_the_modules_this_test_scans():
    """The scan below sees every module of the package (a guard against scanning an empty glob)."""
    assert {path.name for path in PACKAGE.glob("*.py")} >= {"cli.py", "sysfs.py", "match.py", "rules.py", "__main__.py"}


def test_every_import_is_stdlib_or_imds_guest():
    """Each import in src/imds/guest/*.py and the shared leaves is stdlib, ``__future__``, imds.guest or a leaf."""
    shared = [PACKAGE.parent / f"{leaf.removeprefix('imds.')}.py" for leaf in SHARED]
    offenders = {
        f"{path.name}: {name}"
        for path in [*sorted(PACKAGE.glob("*.py")), *shared]
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name not in {"__future__", *SHARED}
        and not (name == "imds.guest" or name.startswith("imds.guest."))
    }
    assert offenders == set()


def test_no_subpackages_escape_the_scan():
    """The package is flat: no subdirectory of modules the scan would miss."""
    assert [path.name for path in PACKAGE.iterdir() if path.is_dir() and path.name != "__pycache__"] == []
