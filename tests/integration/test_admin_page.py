"""The admin web page (``/ui``) in a real headless Chromium against a real ``imds serve --demo``.

Debian's ``chromium`` and ``chromium-driver`` are driven by selenium with explicit paths
(``SE_OFFLINE``: selenium-manager downloads nothing). A screenshot is saved into the test's
tmp dir and ``tests/artifacts/`` (git-ignored), and its path printed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from chromium import WAIT
from serve_process import ADMIN_TOKEN, serving

ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
DEMO_ID = "cc40301c-4038-4011-af55-6eae3ba60246"


def test_search_by_ip_open_the_record_and_see_every_flavor(tmp_path, browser):
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415
    from selenium.webdriver.support.ui import WebDriverWait  # noqa: PLC0415

    with serving(tmp_path, "--demo") as server:
        with httpx.Client(timeout=10) as client:  # an edit, so the change feed has an entry to show
            page = client.get(f"{server.url}/ui")
            assert page.status_code == 200
            assert "cdn" not in page.text.lower()
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert client.get(f"{server.url}/device-search?q=127.0.0.1").status_code == 401
        wait = WebDriverWait(browser, WAIT)
        browser.get(f"{server.url}/ui")
        browser.find_element(By.ID, "token").send_keys(ADMIN_TOKEN)
        browser.find_element(By.ID, "token-save").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "changes"), DEMO_ID))
        search = browser.find_element(By.ID, "search")
        search.clear()
        search.send_keys("127.0.0.1")
        browser.find_element(By.ID, "search-go").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "status"), "1 instance(s) matching 127.0.0.1"))
        rows = browser.find_elements(By.CSS_SELECTOR, "#results tbody tr")
        assert [row.get_attribute("data-id") for row in rows] == [DEMO_ID]
        assert "metadata-example-01" in rows[0].text
        rows[0].click()
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#flavors .flavor[data-flavor='ganeti']")))
        flavors = {box.get_attribute("data-flavor"): box.text
                   for box in browser.find_elements(By.CSS_SELECTOR, "#flavors .flavor")}
        assert set(flavors) == {"json", "ec2", "openstack", "nocloud", "ganeti"}
        assert '"hostname":"metadata-example-01"' in flavors["json"]
        assert DEMO_ID in flavors["ec2"]
        assert '"name": "metadata-example-01"' in flavors["openstack"]
        assert f"instance-id: {DEMO_ID}" in flavors["nocloud"]
        assert "serves nothing" in flavors["ganeti"]
        wait.until(ec.text_to_be_present_in_element((By.ID, "record-json"), '"ipAddresses"'))
        wait.until(lambda driver: "not loaded" not in driver.find_element(By.ID, "events").text)
        assert browser.execute_script("return sessionStorage.getItem('imds-admin-token')") == ADMIN_TOKEN
        shot = tmp_path / "admin-page.png"
        assert browser.save_screenshot(str(shot))
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(shot, ARTIFACTS / "admin-page.png")
    print(f"admin page screenshot: {shot} and {ARTIFACTS / 'admin-page.png'}")  # noqa: T201 - the artifact's path
    assert shot.stat().st_size > 10_000
