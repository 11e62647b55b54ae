"""Running the few system commands the guest tool needs (udevadm, mount, umount, blkid)."""

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


def output(command: list[str], timeout: float) -> str | None:
    """Run ``command`` (no shell, bounded); its stdout, stripped, when it succeeded, else None."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed argument list, no shell
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None
