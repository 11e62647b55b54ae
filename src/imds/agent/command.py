"""Running the host tools the agent drives (``ovs-vsctl``, ``ovs-ofctl``, ``ovsdb-client``, ``ip``)."""

from __future__ import annotations

import subprocess

from imds.errors import OvsCommandFailed

TIMEOUT = 30.0


def run(*args: str, stdin: str | None = None, timeout: float = TIMEOUT) -> str:
    """Run a command to completion (bounded); its stdout, or OvsCommandFailed with its stderr."""
    shown = " ".join(args[:3])
    try:
        result = subprocess.run(  # noqa: S603 - fixed host tools with arguments built by the agent
            list(args), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise OvsCommandFailed(shown, str(exc)) from exc
    if result.returncode != 0:
        raise OvsCommandFailed(shown, result.stderr)
    return result.stdout
