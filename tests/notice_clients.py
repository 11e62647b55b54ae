"""The clients that read lifecycle notices, as their sources have them, and an in-process app on a real socket.

- ``Nth``: aws-node-termination-handler in IMDS mode (``pkg/ec2metadata/ec2metadata.go``,
  ``pkg/monitor/{scheduledevent,spotitn,rebalancerecommendation,asglifecycle}``, the loop in
  ``cmd/node-termination-handler.go``): each monitor polls its path every 2 s; ``Request`` asks
  for a 3600 s token, takes its lifetime from every answer's TTL header, asks again once 15 s
  or less are left, and on a 401 drops the token and tries once more, adding the new token to
  the same request (Go's ``req.Header.Add``: the retry carries the stale token too). A monitor
  error is any non-2xx where the monitor does not expect one (404 is normal for spot,
  rebalance and the ASG state; the scheduled events must be 2xx) or an answer it cannot parse;
  three identical errors in a row stop the process.
- ``wait_for_maintenance``: Google's sample long-poller (``python-docs-samples``
  ``compute/metadata/main.py``): ``wait_for_change`` with ``last_etag`` starting at ``0``, 503
  retried, the callback called when the value changes.
- ``admin``: one admin API call to a real ``imds serve`` (the host's side of each test).
- ``AppOnSocket``: the app built in the test (with its injected clock) served by uvicorn on a
  free loopback port in the test's event loop, so clients speak HTTP over a real socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import uvicorn

from helpers import wait_for_async
from serve_process import Server, free_port

SCHEDULED = "/latest/meta-data/events/maintenance/scheduled"
SPOT = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
ASG = "/latest/meta-data/autoscaling/target-lifecycle-state"
TOKEN_PATH = "/latest/api/token"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_TTL = 3600
SECONDS_BEFORE_REFRESH = 15
TOKEN_ATTEMPTS = 2
DUPLICATE_ERRORS = 3  # cmd/node-termination-handler.go: duplicateErrThreshold
EVENT_DATE = "%d %b %Y %H:%M:%S GMT"  # Go's "2 Jan 2006 15:04:05 GMT" (%d also takes one digit)


def admin(server: Server, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
    """One admin API call to a real ``imds serve``; its JSON answer (anything but 200 fails the test)."""
    with httpx.Client(base_url=server.url, headers=server.admin_headers, timeout=10.0, trust_env=False) as client:
        answer = client.request(method, path, **kwargs)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


class NthError(Exception):
    """What a monitor returns as an error (its text is what the loop compares)."""


class NthStopped(Exception):
    """Three identical errors in a row: aws-node-termination-handler panics and exits."""


@dataclass
class Nth:
    """One aws-node-termination-handler in IMDS mode, its monitors driven by the test (one ``tick`` = 2 s)."""

    client: httpx.AsyncClient
    url: str
    token: str = ""
    token_ttl: int = -1
    token_puts: int = 0
    answers: list[tuple[str, int]] = field(default_factory=list)  # every (path, status) it received
    errors: list[tuple[str, str]] = field(default_factory=list)
    drains: list[tuple[str, str]] = field(default_factory=list)  # (monitor, event id) sent to the drain channel
    cancels: list[tuple[str, str]] = field(default_factory=list)
    _previous: dict[str, str] = field(default_factory=dict)
    _duplicates: dict[str, int] = field(default_factory=dict)

    async def _v2_token(self) -> tuple[str, int]:
        answer = await self.client.put(self.url + TOKEN_PATH, headers={TTL_HEADER: str(TOKEN_TTL)})
        self.token_puts += 1
        self.answers.append((TOKEN_PATH, answer.status_code))
        if not 200 <= answer.status_code < 300:
            raise NthError(f"Received an http status code {answer.status_code}")
        return answer.text, int(answer.headers[TTL_HEADER])

    async def request(self, path: str) -> httpx.Response:
        """``Service.Request``: the token rules, then one GET (two on a 401)."""
        added: list[str] = []  # the token headers added to this one request so far
        answer: httpx.Response | None = None
        for _attempt in range(TOKEN_ATTEMPTS):
            if not self.token or self.token_ttl <= SECONDS_BEFORE_REFRESH:
                try:
                    self.token, self.token_ttl = await self._v2_token()
                except (NthError, KeyError, ValueError):
                    self.token, self.token_ttl = "", -1  # "continuing with IMDSv1"
            if self.token:
                added.append(self.token)
            answer = await self.client.get(self.url + path, headers=[(TOKEN_HEADER, t) for t in added])
            self.answers.append((path, answer.status_code))
            if answer.status_code == 401:
                self.token, self.token_ttl = "", 0
                continue
            break
        assert answer is not None
        with contextlib.suppress(KeyError, ValueError):
            self.token_ttl = int(answer.headers[TTL_HEADER])
        return answer

    async def _json(self, path: str, *, missing_is_normal: bool) -> Any:
        answer = await self.request(path)
        if missing_is_normal and answer.status_code == 404:
            return None
        if not 200 <= answer.status_code < 300:
            raise NthError(f"Metadata request received http status code: {answer.status_code}")
        try:
            return json.loads(answer.content)
        except ValueError as exc:
            raise NthError(f"Could not decode json retrieved from imds: {exc}") from exc

    async def scheduled_events(self) -> None:
        """ScheduledEventMonitor: canceled and completed events to the cancel channel, the others to drain."""
        for event in await self._json(SCHEDULED, missing_is_normal=False):
            try:
                datetime.strptime(event["NotBefore"], EVENT_DATE)  # noqa: DTZ007 - GMT, as Go parses it
            except (KeyError, ValueError) as exc:
                raise NthError(f"unable to parse scheduled event start time: {exc}") from exc
            target = self.cancels if event["State"] in {"canceled", "completed"} else self.drains
            target.append(("scheduled", event["EventId"]))

    async def spot_itn(self) -> None:
        """SpotInterruptionMonitor: 404 is normal; the time must be RFC 3339."""
        action = await self._json(SPOT, missing_is_normal=True)
        if action is None:
            return
        try:
            datetime.fromisoformat(action["time"])
        except (KeyError, ValueError) as exc:
            raise NthError(f"could not parse time from spot interruption notice metadata json: {exc}") from exc
        self.drains.append(("spot", f"{action['action']}@{action['time']}"))

    async def rebalance(self) -> None:
        """RebalanceRecommendationMonitor: 404 is normal."""
        signal = await self._json(REBALANCE, missing_is_normal=True)
        if signal is not None:
            self.drains.append(("rebalance", signal["noticeTime"]))

    async def asg_lifecycle(self) -> None:
        """ASGLifecycleMonitor: 404 is normal (an empty state); ``Terminated`` drains."""
        answer = await self.request(ASG)
        if answer.status_code == 404:
            return
        if not 200 <= answer.status_code < 300:
            raise NthError(f"Metadata request received http status code: {answer.status_code}")
        if answer.text == "Terminated":
            self.drains.append(("asg", answer.text))

    async def tick(self) -> None:
        """One 2 s period: every monitor once, errors counted as the main loop counts them."""
        for name, monitor in (("scheduled", self.scheduled_events), ("spot", self.spot_itn),
                              ("rebalance", self.rebalance), ("asg", self.asg_lifecycle)):
            try:
                await monitor()
            except NthError as exc:
                self.errors.append((name, str(exc)))
                same = self._previous.get(name) == str(exc)
                self._duplicates[name] = self._duplicates.get(name, 0) + 1 if same else 0
                self._previous[name] = str(exc)
                if self._duplicates[name] >= DUPLICATE_ERRORS:
                    raise NthStopped(f"Stopping NTH - Duplicate Error Threshold hit: {name}: {exc}") from exc


def wait_for_maintenance(
    client: httpx.Client, url: str, callback: Callable[[str | None], None], stop: Callable[[], bool],
    *, timeout: float = 30.0,
) -> None:
    """Google's sample long-poller on ``instance/maintenance-event`` (httpx in place of requests)."""
    last_maintenance_event: str | None = None
    last_etag = "0"
    while not stop():
        answer = client.get(url + "/computeMetadata/v1/instance/maintenance-event",
                            params={"wait_for_change": True, "last_etag": last_etag, "timeout_sec": 5},
                            headers={"Metadata-Flavor": "Google"}, timeout=timeout)
        if answer.status_code == 503:
            continue
        answer.raise_for_status()
        last_etag = answer.headers["etag"]
        maintenance_event = None if answer.text == "NONE" else answer.text
        if maintenance_event != last_maintenance_event:
            last_maintenance_event = maintenance_event
            callback(maintenance_event)


def termination_watcher_gce(client: httpx.Client, url: str) -> bool:
    """TensorFlow's ``termination_watcher_function_gce``: is a TERMINATE_ON_HOST_MAINTENANCE coming?"""
    answer = client.get(url + "/computeMetadata/v1/instance/maintenance-event", headers={"Metadata-Flavor": "Google"})
    answer.raise_for_status()
    return answer.text == "TERMINATE_ON_HOST_MAINTENANCE"


class AppOnSocket:
    """uvicorn serving an ASGI app on a free port of 127.0.0.1 in the running loop; stopped on exit."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, lifespan="off", log_level="warning",
                                access_log=False, proxy_headers=False, ws="none")
        self._server = uvicorn.Server(config)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AppOnSocket]:
        task = asyncio.create_task(self._server.serve())
        try:
            await wait_for_async(lambda: self._server.started or task.done(), what="uvicorn to start")
            assert self._server.started, "uvicorn did not start"
            yield self
        finally:
            self._server.should_exit = True
            await asyncio.wait_for(task, 10.0)
