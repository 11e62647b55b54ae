"""``imds config show`` and ``--config`` / ``IMDS_CONFIG`` on real commands."""

from __future__ import annotations

import json

from serve_process import run_imds


def test_config_show_lists_values_with_their_source_and_masks_secrets(tmp_path):
    path = tmp_path / "imds.toml"
    path.write_text('log_level = "debug"\nadmin_token = "file-token"\nmax_body_bytes = 2048\n')
    done = run_imds(tmp_path, "config", "show", "--config", str(path), "--max-body-bytes", "4096", "-o", "json",
                    IMDS_LOG_LEVEL="warning")
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: (row["value"], row["source"]) for row in json.loads(done.stdout)}
    assert rows["config"] == (str(path), "flag")
    assert rows["max_body_bytes"] == ("4096", "flag")
    assert rows["log_level"] == ("warning", "env")
    assert rows["admin_token"] == ("********", "file")
    assert rows["demo"] == ("false", "default")
    assert "file-token" not in done.stdout
    table = run_imds(tmp_path, "config", "show", IMDS_CONFIG=str(path))
    assert any(line.split()[:2] == ["admin_token", "file"] for line in table.stdout.splitlines())


def test_config_show_prints_the_data_dir_and_database_it_will_use(tmp_path):
    """Not given, data_dir and db show what imds derives (XDG_DATA_HOME/imds, an SQLite file in it), not "-"."""
    derived = run_imds(tmp_path, "config", "show", "-o", "json")
    assert derived.returncode == 0, derived.stderr
    rows = {row["name"]: (row["value"], row["source"]) for row in json.loads(derived.stdout)}
    data = tmp_path / "xdg" / "imds"
    assert rows["data_dir"] == (str(data), "default")
    assert rows["db"] == (f"sqlite:///{data / 'imds.db'}", "default")
    other = tmp_path / "elsewhere"
    table = run_imds(tmp_path, "config", "show", "--data-dir", str(other))
    lines = {line.split()[0]: line.split()[1:] for line in table.stdout.splitlines()}
    assert lines["data_dir"] == ["flag", str(other)]
    assert lines["db"] == ["default", f"sqlite:///{other / 'imds.db'}"]
    assert not other.exists()  # showing creates nothing
    given = run_imds(tmp_path, "config", "show", "-o", "json", IMDS_DB="postgres://imds:pw@db.example/fleet")
    rows = {row["name"]: (row["value"], row["source"]) for row in json.loads(given.stdout)}
    assert rows["db"] == ("postgresql://imds:***@db.example/fleet", "env")  # as used: libpq's alias resolved


def test_an_unknown_key_is_a_usage_error_naming_key_and_file(tmp_path):
    path = tmp_path / "imds.toml"
    path.write_text("listen_on = 1\n")
    done = run_imds(tmp_path, "config", "show", IMDS_CONFIG=str(path))
    assert done.returncode == 2
    assert f"config file {path}: unknown key 'listen_on'" in done.stderr


def test_commands_read_the_file(tmp_path):
    """The data directory from the file is where ``imds db upgrade`` and ``imds list`` work."""
    data = tmp_path / "from-file"
    path = tmp_path / "imds.toml"
    path.write_text(f'data_dir = "{data}"\n')
    assert run_imds(tmp_path, "db", "upgrade", "--config", str(path)).returncode == 0
    assert (data / "imds.db").is_file()
    listed = run_imds(tmp_path, "list", "-o", "json", IMDS_CONFIG=str(path))
    assert (listed.returncode, json.loads(listed.stdout)) == (0, [])


def test_help(tmp_path):
    done = run_imds(tmp_path, "config", "show", "--help")
    assert done.returncode == 0
    assert "--config" in done.stdout
    assert "flag" in run_imds(tmp_path, "config", "--help").stdout.lower()
