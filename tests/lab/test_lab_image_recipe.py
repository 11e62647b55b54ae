"""The image recipe: one cached image per Debian suite and package set, built once even when asked twice."""

from __future__ import annotations

import fcntl
import json
import threading
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from imds.cli import cli
from imds.errors import LabError
from imds.lab import image as images
from imds.lab.image import PACKAGES, Recipe, build, cached, installed_version, recipe_key


def _fake_built(out: Path, chosen: Recipe, cloud_init: str = "25.1.4-1") -> Path:
    """A cache entry as a finished build leaves it (manifest last)."""
    target = chosen.directory(out)
    target.mkdir(parents=True)
    for name in ("rootfs.ext4", "vmlinuz", "initrd.img"):
        (target / name).write_bytes(b"")
    (target / "manifest.json").write_text(json.dumps({"key": chosen.key, "cloud_init": cloud_init}))
    return target


def test_each_suite_and_package_set_is_an_image_of_its_own():
    """The suite and the extra packages are part of the key; the default is bookworm with the base packages."""
    assert Recipe().key == recipe_key() == Recipe("bookworm", ()).key
    keys = {Recipe().key, Recipe("trixie").key, Recipe("sid").key, Recipe("sid", ("systemd-imds",)).key}
    assert len(keys) == 4
    assert Recipe("sid", ("b-pkg", "a-pkg", "a-pkg")).key == Recipe("sid", ("a-pkg", "b-pkg")).key
    assert Recipe("sid", ("curl",)).key == Recipe("sid").key  # a base package named again adds nothing
    assert Recipe("sid", ("systemd-imds",)).packages == [*PACKAGES, "systemd-imds"]
    assert Recipe("trixie").describe()["suite"] == "trixie"
    assert Recipe("trixie").directory(Path("/c")) == Path(f"/c/debian-trixie-{Recipe('trixie').key}")


def test_the_bookworm_key_is_the_one_before_suites_existed():
    """Adding --suite did not rename bookworm's cached image (its recipe dict is unchanged)."""
    described = Recipe().describe()
    assert set(described) == {"version", "suite", "variant", "packages", "files", "size"}
    assert described["packages"] == list(PACKAGES)
    assert described["suite"] == "bookworm"


@pytest.mark.parametrize(("suite", "extra", "word"), [
    ("buster", (), "suite"), ("bookworm", ("Bad Name",), "package"), ("sid", ("-x",), "package"),
])
def test_a_recipe_refuses_an_unknown_suite_or_a_bad_package_name(suite, extra, word):
    """LabError naming what was wrong, before anything is built."""
    with pytest.raises(LabError, match=word):
        Recipe(suite, extra)


def test_cached_reads_the_suite_and_cloud_init_version(tmp_path):
    """A built image knows its suite and the cloud-init version the build found in the tree."""
    chosen = Recipe("trixie")
    assert cached(tmp_path, chosen) is None
    _fake_built(tmp_path, chosen)
    found = cached(tmp_path, chosen)
    assert found is not None
    assert (found.suite, found.cloud_init, found.key) == ("trixie", "25.1.4-1", chosen.key)
    assert cached(tmp_path, Recipe()) is None  # bookworm's is another directory


def test_installed_version_reads_dpkg_status(tmp_path):
    """The version dpkg recorded as installed; None for a package absent or only configured."""
    status = tmp_path / "var" / "lib" / "dpkg" / "status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: cloud-init\nStatus: install ok installed\nVersion: 22.4.2-1+deb12u1\nDescription: x\n continued\n\n"
        "Package: half\nStatus: install ok half-configured\nVersion: 1\n\n"
        "Package: curl\nStatus: install ok installed\nVersion: 7.88.1-10\n")
    assert installed_version(tmp_path, "cloud-init") == "22.4.2-1+deb12u1"
    assert installed_version(tmp_path, "curl") == "7.88.1-10"
    assert installed_version(tmp_path, "half") is None
    assert installed_version(tmp_path, "absent") is None
    assert installed_version(tmp_path / "nowhere", "curl") is None


def test_a_second_build_of_one_recipe_waits_for_the_first_and_reuses_it(tmp_path, monkeypatch):
    """While another build holds the recipe's lock, build waits, then reuses its image instead of building."""
    chosen = Recipe("trixie")

    def no_second_build(*_args: object) -> None:
        pytest.fail("built a second time")

    monkeypatch.setattr(images, "_build", no_second_build)
    lock = (tmp_path / f".build-{chosen.key}.lock").open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # the first build, still running
    said: list[str] = []
    found: list[object] = []
    waiter = threading.Thread(target=lambda: found.append(build(tmp_path, None, said.append, chosen)))
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive()  # waiting on the lock
    _fake_built(tmp_path, chosen)
    fcntl.flock(lock, fcntl.LOCK_UN)
    lock.close()
    waiter.join(timeout=30.0)
    assert not waiter.is_alive()
    assert found
    assert found[0].suite == "trixie"  # type: ignore[attr-defined]
    assert any("waiting" in line for line in said)
    assert any("reusing" in line for line in said)


def test_the_cli_takes_suite_and_package_and_refuses_an_unknown_suite(tmp_path):
    """``--suite`` is a choice (exit 2 for another); both commands document it."""
    runner = CliRunner()
    refused = runner.invoke(cli, ["lab", "image", "build", "--out", str(tmp_path), "--suite", "buster"])
    assert refused.exit_code == 2
    assert "buster" in refused.output
    for command in (["lab", "image", "build", "--help"], ["lab", "boot", "--help"]):
        shown = runner.invoke(cli, command)
        assert "--suite [bookworm|trixie|sid]" in shown.output
        assert "--package NAME" in shown.output
    _fake_built(tmp_path, Recipe("sid", ("systemd-imds",)))
    built = runner.invoke(cli, ["lab", "image", "build", "--out", str(tmp_path), "--suite", "sid",
                                "--package", "systemd-imds"])
    assert built.exit_code == 0, built.output
    assert built.stdout.strip() == str(Recipe("sid", ("systemd-imds",)).directory(tmp_path))


def test_trixie_asks_openstacks_ipv6_address_with_the_first_nics_index_as_its_zone():
    """The trixie image names fe80::a9fe:a9fe%<index 2>, then 169.254.169.254; bookworm's and sid's are unchanged.

    cloud-init 25.1's own default zone is the interface's name (``%25ens2``), which trixie's
    python3-requests hands to getaddrinfo still encoded: no IPv6-only OpenStack guest got its
    metadata until the image said otherwise (docs/lab.md).
    """
    name = "etc/cloud/cloud.cfg.d/91-imds-lab-openstack-ipv6.cfg"
    config = yaml.safe_load(Recipe("trixie").files[name])
    assert config == {"datasource": {"OpenStack": {"metadata_urls": [
        f"http://[fe80::a9fe:a9fe%25{images.OPENSTACK_V6_ZONE_INDEX}]", "http://169.254.169.254"]}}}
    assert images.OPENSTACK_V6_ZONE_INDEX == 2  # lo is 1; the lab's guest has one NIC at boot
    assert Recipe("trixie").describe()["files"][name] == Recipe("trixie").files[name]
    for other in ("bookworm", "sid"):
        assert name not in Recipe(other).files
        assert Recipe(other).describe()["files"] == images.FILES
    assert any(name in hook for hook in images._hooks(Recipe("trixie").files))
    assert Recipe().key == "5a7747ecfdb984b4"  # bookworm's cached image (CI's) keeps its name
