"""haproxy's request log lines as the agent re-emits them (the real haproxy writes them in the integration tests)."""

from __future__ import annotations

import json
import socket

from structlog.testing import capture_logs

from helpers import wait_for
from imds import log
from imds.agent.requestlog import RequestLog, parse

LINE = {"port": "tap-a", "instance_id": "uuid-a", "tenant": "", "source": "240.0.0.2", "method": "GET",
        "path": "/latest/meta-data/instance-id", "status": 200, "bytes": 312, "request_ms": 0, "connect_ms": -1,
        "response_ms": 3, "total_ms": 4, "termination": "----", "tls_error": ""}


def test_a_request_line_becomes_one_event_without_the_fields_haproxy_had_nothing_for():
    """Empty strings and -1 timings (no backend connection) are dropped; the rest is kept as haproxy wrote it."""
    event, fields = parse(json.dumps(LINE).encode() + b"\n")
    assert event == "haproxy.request"
    assert fields == {"port": "tap-a", "instance_id": "uuid-a", "source": "240.0.0.2", "method": "GET",
                      "path": "/latest/meta-data/instance-id", "status": 200, "bytes": 312, "request_ms": 0,
                      "response_ms": 3, "total_ms": 4, "termination": "----"}


def test_anything_else_haproxy_logs_is_a_message_cut_to_a_bounded_length():
    """A proxy stopping on reload, a truncated (over-long) line: kept as text, never parsed as a request."""
    assert parse(b"Proxy metadata stopped (cumulated conns: FE: 2, BE: 0).") == (
        "haproxy.message", {"text": "Proxy metadata stopped (cumulated conns: FE: 2, BE: 0)."})
    event, fields = parse(b'{"port":"tap-a","path":"/' + b"a" * 5000)
    assert event == "haproxy.message"
    assert len(fields["text"]) == 512


def test_the_pair_carries_each_datagram_to_the_agents_log():
    """What haproxy writes into its end comes out of the agent's logger, one event per datagram."""
    with capture_logs() as logs:
        requests = RequestLog(log.get("agent"))
        requests.start()
        try:
            with socket.socket(fileno=socket.dup(requests.haproxy_end)) as haproxy_end:
                haproxy_end.send(json.dumps(LINE).encode())
                haproxy_end.send(b"Proxy metadata stopped")
            wait_for(lambda: len(logs) >= 2, what="both lines in the log", timeout=10)
        finally:
            requests.stop()
    assert [entry["event"] for entry in logs] == ["haproxy.request", "haproxy.message"]
    assert logs[0]["instance_id"] == "uuid-a"
