"""``imds events list|follow``: the events an instance posted, read through the admin API.

Both print one JSON object per line. ``follow`` streams ``/device-events/{id}/stream``
(Server-Sent Events) and reconnects after the last cursor it printed when the stream
breaks; stop it with Ctrl-C or SIGTERM. The token is ``--token``, else IMDS_ADMIN_TOKEN.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import click
import httpx

from imds.cli.options import resolve

DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_SECONDS = 1.0


def _headers(token: str | None) -> dict[str, str]:
    token = token or resolve({}).admin_token
    return {"Authorization": f"Bearer {token}"} if token else {}


def _fail(answer: httpx.Response) -> None:
    if answer.status_code != 200:
        raise click.ClickException(f"{answer.request.url.path}: {answer.status_code} {answer.text.strip()}")


def sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The ``data`` of each Server-Sent Event in ``lines`` (one data line per event, as imds sends)."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: ") :]


_URL = click.option("--url", default=DEFAULT_URL, show_default=True, help="Base URL of imds serve.")
_TOKEN = click.option("--token", default=None, help="Admin bearer token (default: IMDS_ADMIN_TOKEN).")
_INSTANCE = click.option("--instance", "instance_id", required=True, help="Instance id.")
_AFTER = click.option("--after", default=0, type=click.IntRange(min=0), help="Only events after this cursor.")


@click.group()
def events() -> None:
    """Events instances posted (/events, /phone-home, /ganeti/<v>/write)."""


@events.command(name="list")
@_INSTANCE
@_URL
@_TOKEN
@_AFTER
def list_events(instance_id: str, url: str, token: str | None, after: int) -> None:
    """Print the stored events after --after, one JSON object per line."""
    with httpx.Client(base_url=url, headers=_headers(token), timeout=30.0, trust_env=False) as client:
        while True:
            answer = client.get(f"/device-events/{instance_id}", params={"after": after})
            _fail(answer)
            page: dict[str, Any] = answer.json()
            for event in page["events"]:
                click.echo(json.dumps(event))
            if not page["events"]:
                return
            after = page["cursor"]


@events.command()
@_INSTANCE
@_URL
@_TOKEN
@_AFTER
def follow(instance_id: str, url: str, token: str | None, after: int) -> None:
    """Print stored events after --after, then each new one as it is posted (JSON lines)."""
    timeout = httpx.Timeout(30.0, read=None)  # the stream is idle between events (keepalive every 15 s)
    with httpx.Client(base_url=url, headers=_headers(token), timeout=timeout, trust_env=False) as client:
        while True:
            try:
                with client.stream("GET", f"/device-events/{instance_id}/stream", params={"after": after}) as answer:
                    if answer.status_code != 200:
                        answer.read()
                        _fail(answer)
                    for data in sse_data(answer.iter_lines()):
                        click.echo(data)
                        after = max(after, int(json.loads(data)["cursor"]))
            except httpx.TransportError as exc:
                click.echo(f"imds events follow: {exc}; reconnecting after cursor {after}", err=True)
            time.sleep(RETRY_SECONDS)
