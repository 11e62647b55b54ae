"""Running the few system commands the guest tool needs (udevadm, mount, umount)."""

from __future__ import annotations

import subprocess


def failure(command: list[str], timeout: float) -> str | None:
    """Run ``command`` (no shell, bounded); None when it succeeded, else a one-line reason."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed argument list, no shell
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return done.stderr.strip() or f"exit status {done.returncode}"
    return None
