"""A headless Chromium for the browser tests (a pytest plugin: the ``browser`` fixture).

Debian's ``chromium`` and ``chromium-driver`` are driven by selenium with explicit paths
(``SE_OFFLINE``: selenium-manager downloads nothing).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
WAIT = 20  # seconds: a generous bound on a loaded 2-core machine
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1400,1000")


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless Chromium with a fresh profile, quit (by selenium, which stops its driver) afterwards."""
    os.environ["SE_OFFLINE"] = "true"  # never let selenium-manager download a browser or driver
    from selenium import webdriver  # noqa: PLC0415 - imported after SE_OFFLINE is set
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    assert CHROMIUM.exists(), "apt-get install chromium (scripts/test does)"
    assert CHROMEDRIVER.exists(), "apt-get install chromium-driver (scripts/test does)"
    profile = tempfile.mkdtemp(prefix="imds-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(WAIT)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
