"""The one log setup (``imds.log.configure``): what reaches stderr, and what stays off.

These run the setup in this process (its handler writes to the test's stderr); the
``restored`` fixture puts stdlib logging and structlog back as they were.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import structlog
from click.testing import CliRunner

from imds import log
from imds.cli import cli
from serve_process import ADMIN_TOKEN, serving


@pytest.fixture
def restored() -> Iterator[None]:
    """Stdlib logging's root handlers and levels, and structlog's configuration, as before the test."""
    root = logging.getLogger()
    named = [logging.getLogger(name) for name in (*log.QUIET_DRIVERS, *log.QUIET_CLIENTS, "alembic.runtime.plugins")]
    saved = root.handlers[:], root.level, [logger.level for logger in named], structlog.get_config()
    access = logging.getLogger("uvicorn.access").disabled
    try:
        yield
    finally:
        handlers, level, levels, config = saved
        root.handlers[:] = handlers
        root.setLevel(level)
        for logger, each in zip(named, levels, strict=True):
            logger.setLevel(each)
        logging.getLogger("uvicorn.access").disabled = access
        structlog.configure(**config)


def _answer(_request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"ok": True})


@pytest.mark.usefixtures("restored")
@pytest.mark.parametrize("level", ["info", "debug"])
def test_httpx_request_lines_stay_off_and_its_warnings_pass(level: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The "HTTP Request: GET … 200 OK" lines (httpx, INFO) and httpcore's DEBUG lines stay off; a warning shows."""
    log.configure(level)
    with httpx.Client(transport=httpx.MockTransport(_answer)) as client:
        assert client.get("http://upstream.invalid/instances/x").json() == {"ok": True}
    logging.getLogger("httpcore.connection").debug("connect_tcp.started host='upstream.invalid'")
    logging.getLogger("httpx").warning("a warning still shows")
    err = capsys.readouterr().err
    assert "HTTP Request" not in err, err
    assert "connect_tcp" not in err, err
    assert '"event": "a warning still shows"' in err, err


@pytest.mark.usefixtures("restored")
def test_a_url_command_prints_only_its_answer(tmp_path: Path) -> None:
    """``imds list --url`` in-process against a real server: stdout the table, stderr only the count, no log line."""
    runner = CliRunner()
    with serving(tmp_path, "--db", "memory://") as server:
        result = runner.invoke(cli, ["list", "--url", server.url, "--token", ADMIN_TOKEN], catch_exceptions=False)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    assert result.stdout.split() == ["ID", "HOSTNAME", "ADDRESSES", "METADATA", "USERDATA"]
    assert result.stderr == "0 instances\n"
