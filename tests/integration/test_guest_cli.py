"""``imds guest udev`` as it ships: the system python alone, a zipapp, ``python -m``, and the ``imds`` command.

The system interpreter runs isolated (``-I -S``: no site-packages, no venv, no PYTHONPATH)
on a copy of ``imds/__init__.py`` + ``imds/guest/``, which proves the package needs nothing
outside the standard library. Every run targets a fake sysfs/dev tree and a rules file in
tmp_path, and a fake udevadm; the host's /sys, /etc and udev are never touched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipapp
from pathlib import Path

import pytest
from click.testing import CliRunner

import imds
from guest_zipapp import build_documented_zipapp
from imds.cli import cli
from imds.guest.testing import FakeSystem, MetadataServer

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "guest"))

from guest_machines import example_machine, load_fixture, make_config_drive, write_script

SYSTEM_PYTHON = "/usr/bin/python3"
IMDS = Path(sys.executable).parent / "imds"
SOURCE = Path(imds.__file__).parent
TIMEOUT = 30


@pytest.fixture
def machine(tmp_path):
    """example.json's machine, its config drive, and the udev arguments that point at both."""
    fake = example_machine(FakeSystem(tmp_path / "machine"))
    drive = make_config_drive(tmp_path / "drive", load_fixture("example"))
    return ["udev", "--sysfs-root", str(fake.sys), "--dev-root", str(fake.dev), "--config-drive", str(drive)]


@pytest.fixture
def expected(machine, capsys):
    """The rules the in-process (venv) main prints for ``machine``."""
    from imds.guest.cli import main  # noqa: PLC0415 - the module under test, imported where compared

    assert main([*machine, "--dry-run"]) == 0
    return capsys.readouterr().out


@pytest.fixture
def image(tmp_path):
    """What an image carries: imds/__init__.py, imds/tarball.py and imds/guest/*.py, nothing else."""
    root = tmp_path / "image"
    (root / "imds" / "guest").mkdir(parents=True)
    for leaf in ("__init__.py", "tarball.py"):
        shutil.copy(SOURCE / leaf, root / "imds" / leaf)
    for module in (SOURCE / "guest").glob("*.py"):
        shutil.copy(module, root / "imds" / "guest" / module.name)
    return root


def _run(*command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False, **kwargs)


def test_system_python_imports_only_the_standard_library(image):
    """/usr/bin/python3 -I -S imports every guest module from the image copy; no non-stdlib module loads."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import imds.guest.cli, imds.guest.testing, imds.guest.sources, imds.guest.apply, imds.guest.ganeti;"
        "print(imds.__file__);"
        "print(sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) - {'__main__'}))"
    )
    done = _run(SYSTEM_PYTHON, "-I", "-S", "-c", code, str(image))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(image / "imds" / "__init__.py"), "['imds']"]


def test_system_python_runs_the_module_isolated(image, machine, expected):
    """``python3 -m imds.guest udev --dry-run`` on the system python alone prints the same rules as the venv."""
    code = "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module('imds.guest', run_name='__main__')"
    done = _run(SYSTEM_PYTHON, "-I", "-S", "-c", code, str(image), *machine, "--dry-run")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == expected


@pytest.fixture
def documented_zipapp(tmp_path):
    """imds-guest.pyz built by running docs/guest.md's recipe literally, in a directory whose src/ is ours."""
    return build_documented_zipapp(tmp_path / "checkout")


def test_zipapp_runs_on_the_system_python(documented_zipapp, machine, expected):
    """The .pyz the docs build is all an image needs; it runs isolated and prints the same rules."""
    done = _run(SYSTEM_PYTHON, "-I", "-S", str(documented_zipapp), *machine, "--dry-run")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == expected
    usage = _run(SYSTEM_PYTHON, "-I", "-S", str(documented_zipapp), "udev", "--help")
    assert usage.stdout.startswith("usage: imds-guest.pyz udev [-h]")


def test_documented_zipapp_exits_non_zero_on_failure(documented_zipapp, tmp_path):
    """A failing run of the documented .pyz exits with main()'s status (2), so a systemd unit sees it."""
    done = _run(SYSTEM_PYTHON, "-I", "-S", str(documented_zipapp), "udev", "--config-drive", str(tmp_path / "absent"))
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "error: config drive" in done.stderr


def test_zipapp_main_entry_point_would_hide_failures(image, tmp_path):
    """Why the recipe writes __main__.py: zipapp's ``-m module:fn`` drops the return value and exits 0."""
    archive = tmp_path / "dropped.pyz"
    zipapp.create_archive(image, archive, interpreter=SYSTEM_PYTHON, main="imds.guest.cli:main")
    done = _run(SYSTEM_PYTHON, "-I", "-S", str(archive), "udev", "--config-drive", str(tmp_path / "absent"))
    assert done.returncode == 0
    assert "error: config drive" in done.stderr


def test_python_m_from_metadata_url_is_idempotent(tmp_path):
    """Two real runs against a real HTTP server: one write and reload, then nothing; mtime unchanged."""
    fake = example_machine(FakeSystem(tmp_path / "machine"))
    rules = tmp_path / "rules.d" / "70-imds-device-tags.rules"
    log = tmp_path / "udevadm.log"
    udevadm = write_script(tmp_path / "udevadm", f'echo "$*" >> "{log}"')
    with MetadataServer() as server:
        server.routes["/openstack/latest/meta_data.json"] = (200, json.dumps(load_fixture("example")).encode())
        command = [
            sys.executable, "-m", "imds.guest", "udev", "--metadata-url", server.url, "--sysfs-root", str(fake.sys),
            "--dev-root", str(fake.dev), "--rules-file", str(rules), "--udevadm", str(udevadm),
        ]
        first = _run(*command)
        mtime = rules.stat().st_mtime_ns
        second = _run(*command)
    assert (first.returncode, first.stdout) == (0, f"wrote {rules} (4 tagged devices)\nudev reloaded\n")
    assert (second.returncode, second.stdout) == (0, f"{rules} unchanged (4 tagged devices)\n")
    assert rules.stat().st_mtime_ns == mtime
    assert log.read_text().splitlines() == [
        "control --reload",
        "trigger --action=change --subsystem-match=block --subsystem-match=net",
    ]
    assert server.requests == ["/openstack/latest/meta_data.json"] * 2


def test_imds_guest_delegates_to_the_same_main(machine, expected):
    """``imds guest udev …`` (click) passes every argument through to the argparse main."""
    result = CliRunner().invoke(cli, ["guest", *machine, "--dry-run"])
    assert result.exit_code == 0
    assert result.output == expected


def test_imds_guest_help_is_argparse_help():
    """``imds guest udev --help`` is the argparse help, named ``imds guest udev``; ``imds --help`` lists guest."""
    result = CliRunner().invoke(cli, ["guest", "udev", "--help"])
    assert result.exit_code == 0
    assert result.output.startswith("usage: imds guest udev [-h] [--config-drive PATH|auto | --metadata-url URL]")
    assert "In-guest tools: udev rules from role tags; Ganeti OS install." in CliRunner().invoke(cli, ["--help"]).output


def test_imds_command_exit_status_reaches_the_shell(tmp_path):
    """The installed ``imds`` script exits 1 when a tagged device is missing, and says which on stderr."""
    fake = FakeSystem(tmp_path / "machine")
    fake.virtio_disk("vdb", "0000:00:07.0", serial="disk-vol-24235252")
    drive = make_config_drive(tmp_path / "drive", {"devices": load_fixture("example")["devices"][2:]})
    done = _run(str(IMDS), "guest", "udev", "--config-drive", str(drive), "--sysfs-root", str(fake.sys),
                "--dev-root", str(fake.dev), "--dry-run")
    assert done.returncode == 1
    assert done.stderr.startswith("imds guest: not found: disk #0 (bus scsi, address 1:0:2:0")
    assert 'ATTRS{serial}=="disk-vol-24235252"' in done.stdout


def test_usage_error_is_exit_2_through_imds():
    """A usage error from argparse keeps its status 2 through the click command."""
    done = _run(str(IMDS), "guest", "udev", "--timeout", "soon")
    assert done.returncode == 2
    assert "imds guest udev: error: argument --timeout: 'soon' is not a positive number of seconds" in done.stderr
