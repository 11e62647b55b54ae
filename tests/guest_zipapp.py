"""The guest tool's zipapp built exactly as docs/guest.md says ("build one self-contained file")."""

from __future__ import annotations

import subprocess
from pathlib import Path

import imds

DOCS = Path(__file__).parents[1] / "docs" / "guest.md"
SOURCE = Path(imds.__file__).parent
TIMEOUT = 60


def documented_zipapp_commands() -> list[str]:
    """docs/guest.md's zipapp recipe: the commands from "build one self-contained file" up to the install."""
    recipe = DOCS.read_text().split("# … or build one self-contained file", 1)[1].split("```", 1)[0]
    commands = [line for line in recipe.splitlines()[1:] if line.strip() and not line.startswith("#")]
    assert commands[-1].startswith("install "), commands  # installing into an image is the reader's part
    return commands[:-1]


def build_documented_zipapp(workdir: Path) -> Path:
    """Run the recipe in ``workdir`` (whose ``src`` is this checkout's); the ``imds-guest.pyz`` it made."""
    workdir.mkdir(parents=True)
    (workdir / "src").symlink_to(SOURCE.parent)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(documented_zipapp_commands())], cwd=workdir,
                          capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    return workdir / "imds-guest.pyz"
