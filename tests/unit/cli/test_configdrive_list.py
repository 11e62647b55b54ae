"""``imds configdrive list ISO``: what the README uses to look inside a drive (no isoinfo needed)."""

from __future__ import annotations

from click.testing import CliRunner

from imds.cli import cli
from imds.configdrive.iso import iso_bytes


def test_lists_the_label_and_every_file_with_its_size(tmp_path):
    """The label comes first, then each Rock Ridge path (real names, not mangled ones) with its size."""
    image = tmp_path / "drive.iso"
    image.write_bytes(iso_bytes({"openstack/latest/meta_data.json": b"{}", "ec2/latest/user-data": b"#!x"}, "config-2"))
    result = CliRunner().invoke(cli, ["configdrive", "list", str(image)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "label config-2"
    assert [line.split() for line in lines[1:]] == [
        ["3", "/ec2/latest/user-data"], ["2", "/openstack/latest/meta_data.json"],
    ]


def test_a_file_that_is_not_an_iso_is_a_one_line_error(tmp_path):
    """A non-ISO exits 1 with a message naming the file."""
    image = tmp_path / "not.iso"
    image.write_bytes(b"hello" * 1000)
    result = CliRunner().invoke(cli, ["configdrive", "list", str(image)])
    assert result.exit_code == 1
    assert f"{image}: not a readable ISO 9660 image" in result.output
