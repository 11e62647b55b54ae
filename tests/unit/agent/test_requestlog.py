"""haproxy's request log lines as the agent re-emits them (the real haproxy writes them in the integration tests)."""

from __future__ import annotations

import datetime as dt
import json
import socket

from structlog.testing import capture_logs

from helpers import wait_for
from imds import log
from imds.agent.requestlog import RequestLog, request_line

LINE = {"port": "tap-a", "instance_id": "uuid-a", "tenant": "", "source": "240.0.0.2", "method": "GET",
        "path": "/latest/meta-data/instance-id", "status": 200, "bytes": 312, "request_ms": 0, "connect_ms": -1,
        "response_ms": 3, "total_ms": 4, "termination": "----", "tls_error": ""}
NOW = dt.datetime(2026, 11, 28, 9, 40, 33, 843106, tzinfo=dt.UTC)


class Lines:
    """A ``PrintLogger`` stand-in keeping each line written."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def msg(self, message: str) -> None:
        self.lines.append(message)


def test_a_request_line_becomes_one_agent_log_line_with_every_field_haproxy_wrote():
    """The object haproxy wrote, plus what structlog puts on every line: component, event, level, timestamp."""
    line = request_line(json.dumps(LINE).encode() + b"\n", NOW)
    assert line is not None
    assert "\n" not in line
    assert json.loads(line) == {**LINE, "component": "agent", "event": "haproxy.request", "level": "info",
                                "timestamp": "2026-11-28T09:40:33.843106Z"}


def test_what_haproxy_had_nothing_for_is_an_empty_string_not_its_dash():
    """A sample haproxy had nothing for (no tenant, no TLS error, an unknown source) is "", not its "-"."""
    absent = {**LINE, "tenant": "-", "tls_error": "-", "port": "-", "instance_id": "-"}
    written = json.dumps(absent, separators=(",", ":")).encode()  # as haproxy writes it: no spaces
    line = request_line(written, NOW)
    assert line is not None
    entry = json.loads(line)
    assert (entry["tenant"], entry["tls_error"], entry["port"], entry["instance_id"]) == ("", "", "", "")
    assert (entry["path"], entry["termination"], entry["connect_ms"]) == (LINE["path"], "----", -1)


def test_anything_else_is_not_a_request_line():
    """A proxy stopping on reload, a line cut short at haproxy's length limit, two lines in one: not requests."""
    assert request_line(b"Proxy metadata stopped (cumulated conns: FE: 2, BE: 0).", NOW) is None
    assert request_line(b'{"port":"tap-a","path":"/' + b"a" * 5000, NOW) is None
    assert request_line(json.dumps(LINE).encode() + b"\n" + json.dumps(LINE).encode(), NOW) is None


def test_the_pair_carries_each_datagram_to_the_agents_log():
    """What haproxy writes into its end comes out: requests as lines, anything else as haproxy.message (cut)."""
    out = Lines()
    with capture_logs() as logs:
        requests = RequestLog(log.get("agent"), out=out)
        requests.start()
        try:
            with socket.socket(fileno=socket.dup(requests.haproxy_end)) as haproxy_end:
                haproxy_end.send(json.dumps(LINE).encode())
                haproxy_end.send(b"Proxy metadata stopped " + b"x" * 1000)
            wait_for(lambda: out.lines and logs, what="both lines in the log", timeout=10)
        finally:
            requests.stop()
    assert json.loads(out.lines[0])["instance_id"] == "uuid-a"
    assert [entry["event"] for entry in logs] == ["haproxy.message"]
    assert logs[0]["text"].startswith("Proxy metadata stopped")
    assert len(logs[0]["text"]) == 512


def test_above_info_no_request_is_re_emitted():
    """--log-level warning: request lines are read (haproxy never blocks) and dropped; others go to structlog."""
    out = Lines()
    with capture_logs() as logs:
        requests = RequestLog(log.get("agent"), out=out, enabled=False)
        requests.start()
        try:
            with socket.socket(fileno=socket.dup(requests.haproxy_end)) as haproxy_end:
                haproxy_end.send(json.dumps(LINE).encode())
                haproxy_end.send(b"")  # an empty datagram does not stop the reader
                haproxy_end.send(b"Proxy metadata stopped")
            wait_for(lambda: logs, what="the message after the request", timeout=10)
        finally:
            requests.stop()
    assert out.lines == []
    assert logs[0]["text"] == "Proxy metadata stopped"
