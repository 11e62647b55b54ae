"""A headless Chromium for the browser tests (a pytest plugin: the ``browser`` fixture).

Debian's ``chromium`` and ``chromium-driver`` are driven by selenium with explicit paths
(``SE_OFFLINE``: selenium-manager downloads nothing).

chromedriver listens on one port on both 127.0.0.1 and ::1 and exits 1 ("bind() failed: Address
already in use") if either is taken. selenium picks the port free on IPv4 only and lets it go before
the driver binds it, so on a busy machine the driver can lose that race. The fixture picks a port
free on both families, keeps the driver's log, and starts again on a new port only when the log
says the port was taken; any other failure is raised with the driver's own words.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT = 20  # seconds: a generous bound on a loaded 2-core machine
PORT_TRIES = 5  # starts on fresh ports before a lost port race is reported as a failure
PORT_TAKEN = "Address already in use"  # what chromedriver logs (bind() failed) before exiting 1
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


def free_port_both_families() -> int:
    """A port nothing holds on 127.0.0.1 nor on ::1 at the moment of asking (the driver binds both)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as v4:
            v4.bind(("127.0.0.1", 0))
            port: int = v4.getsockname()[1]
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as v6:
                try:
                    v6.bind(("::1", port))
                except OSError as error:
                    if error.errno == errno.EADDRINUSE:
                        continue
                return port  # free on both, or a machine without ::1 (the driver then listens on IPv4 alone)


def start_driver(options: Any, logs: Path) -> Any:
    """Start chromedriver and Chromium; a port lost to another process is retried on a new one."""
    from selenium import webdriver  # noqa: PLC0415 - imported after SE_OFFLINE is set
    from selenium.common.exceptions import WebDriverException  # noqa: PLC0415
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    said = ""
    for attempt in range(PORT_TRIES):
        log = logs / f"chromedriver-{attempt}.log"  # one per start: an earlier lost race is not read again
        service = Service(executable_path=str(CHROMEDRIVER), port=free_port_both_families(),
                          log_output=str(log))
        try:
            return webdriver.Chrome(service=service, options=options)
        except WebDriverException as error:
            said = log.read_text(errors="replace") if log.exists() else ""
            if PORT_TAKEN not in said:
                raise WebDriverException(f"{error.msg}; chromedriver said: {said[-2000:]!r}") from error
    raise AssertionError(f"chromedriver lost its port {PORT_TRIES} times running: {said[-2000:]!r}")


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, quit (by selenium, which stops its driver) afterwards."""
    os.environ["SE_OFFLINE"] = "true"  # never let selenium-manager download a browser or driver
    from selenium import webdriver  # noqa: PLC0415 - imported after SE_OFFLINE is set

    assert CHROMIUM.exists(), "apt-get install chromium (scripts/test does)"
    assert CHROMEDRIVER.exists(), "apt-get install chromium-driver (scripts/test does)"
    profile = tempfile.mkdtemp(prefix="imds-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = start_driver(options, Path(profile))
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
