"""Test support for the console in a real headless Chromium (selenium, Debian's chromium
and chromium-driver): the driver, waits that survive live updates, and screenshots
that must show a page. Skipped only when Chromium is not installed and CI is not set:
under CI=true it is required.

With TROTH_CONSOLE_SCREENSHOTS=DIR the screenshots are also written there
(`docs/images/` holds the docs', made so)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from _png import colours

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from selenium.webdriver.remote.webdriver import WebDriver

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
T = TypeVar("T")


def skip_without_chromium() -> None:
    """Skip the calling module when Chromium is missing, unless CI=true (then required)."""
    if not (CHROMIUM and DRIVER) and os.environ.get("CI") != "true":
        pytest.skip(
            "Chromium is not installed: apt-get install -y chromium chromium-driver "
            "(required under CI=true)",
            allow_module_level=True,
        )


def chromium() -> Iterator[WebDriver]:
    """A headless Chromium with a profile of its own, quit after (a fixture's body)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM and DRIVER, "CI=true: install chromium and chromium-driver"
    profile = tempfile.mkdtemp(prefix="troth-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1280,900",
                 "--force-device-scale-factor=1", f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=DRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait(driver: WebDriver, check: Any, what: str, timeout: float = 30) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(check, message=what)


def text_of(driver: WebDriver, selector: str) -> str:
    """The text of the element `selector` finds now ("" if none): read in one script,
    so a live update swapping the page's content in between cannot make it stale."""
    found = driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.textContent : ''",
        selector,
    )
    return str(found).strip()


def steady(action: Callable[[], T]) -> T:
    """Run `action` (find elements of a live page and act on them) again if a live
    update swapped the page's content between the finding and the acting. Once a form
    is being filled in, the page holds still (console.js), so a send_keys is a safe
    first act."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(9):
        try:
            return action()
        except StaleElementReferenceException:
            time.sleep(0.05)
    return action()


def live(driver: WebDriver, page: str) -> None:
    """Wait until the page's event stream is in place and the page has re-read itself
    once (what the stream's `ready` does), so that its elements stay put after."""
    wait(driver, lambda d: d.execute_script("return document.body.dataset.updated"),
         f"{page}'s live stream")  # fmt: skip


def screenshot(driver: WebDriver, name: str, tmp: Path) -> None:
    """A screenshot that must show a page (many colours), kept where asked."""
    png = driver.get_screenshot_as_png()
    assert colours(png) > 50, f"the {name} screenshot is blank"
    (tmp / f"{name}.png").write_bytes(png)
    wanted = os.environ.get("TROTH_CONSOLE_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        (Path(wanted) / f"{name}.png").write_bytes(png)
