"""The console in a real headless Chromium (selenium, Debian's chromium and
chromium-driver): the inbox, a schema form filled in and approved, the workflow's
timeline updating live as the workflow goes on, and screenshots that are not blank.

With TROTH_CONSOLE_SCREENSHOTS=DIR the screenshots are also written there
(`docs/images/` holds the README's, made so). Skipped only when Chromium is not
installed and CI is not set: under CI=true it is required.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from _browser import chromium, live, screenshot, skip_without_chromium, text_of, wait
from _console import start_console
from _support import eventually, start_server

from troth import Client, Context, PromiseState, Worker

if TYPE_CHECKING:
    from pathlib import Path

    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.e2e
skip_without_chromium()

from selenium.webdriver.common.by import By  # noqa: E402 (after the skip: selenium needs a browser)
from selenium.webdriver.support.ui import Select  # noqa: E402

GROUP = "console-browser"
DECISION = {
    "type": "object",
    "required": ["approved", "channel"],
    "properties": {
        "approved": {"type": "boolean", "title": "Approved"},
        "channel": {"enum": ["blog", "newsletter", "both"], "title": "Channel"},
        "note": {"type": "string", "title": "Note", "description": "shown to the author"},
    },
}
TITLES = {7: "Launch of the spring catalogue", 8: "Price change for the Pro plan",
          9: "Post-mortem of the 12 March outage"}  # fmt: skip


def draft(post: int) -> str:
    return f"draft of post {post}"


def publish(post: int, channel: str) -> str:
    return f"post {post} published on {channel}"


def launch(ctx: Context, post: int) -> Generator[Any, Any, Any]:
    text = yield ctx.run(draft, post)
    approval = yield ctx.promise(
        title=f"Publish “{TITLES.get(post, post)}”?",
        message=f"The editor wrote the {text}; it goes out once approved.",
        schema=DECISION,
        timeout=timedelta(hours=20),
    )
    decision = yield approval
    legal = yield ctx.promise(
        title=f"Legal sign-off for post {post}",
        message="Legal reads it once the editor has approved.",
        timeout=timedelta(hours=20),
    )
    yield legal
    return (yield ctx.run(publish, post, decision["channel"]))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Client]]:
    workdir = tmp_path_factory.mktemp("console-browser")
    server = start_server(workdir)
    console = start_console(workdir, server.address)
    client = Client(server.address, timeout=10, principal="newsroom")
    worker = Worker(Client(server.address, timeout=10, principal="editor-bot"), group=GROUP)
    worker.workflow(launch)
    worker.start()
    try:
        yield console.url, client
    finally:
        worker.stop()
        client.close()
        assert console.stop() == 0, console.log()[-3000:]
        assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    yield from chromium()


def test_approve_in_the_browser_and_watch_the_timeline_update(
    stack: tuple[str, Client], browser: WebDriver, tmp_path: Path
) -> None:
    url, client = stack
    run = uuid.uuid4().hex[:6]
    ids = {post: f"launch-{post}-{run}" for post in (7, 8, 9)}
    for post, wid in ids.items():
        client.start("launch", post, id=wid, group=GROUP)
    for wid in ids.values():
        eventually(lambda wid=wid: client.get(wid).state is PromiseState.PENDING, 20)
        eventually(lambda wid=wid: _exists(client, f"{wid}.1"), 20, f"{wid}'s approval")
    wid, step = ids[7], f"{ids[7]}.1"

    # Sign in by name (the server runs without authentication: a name is enough).
    browser.get(f"{url}/signin")
    browser.find_element(By.NAME, "name").send_keys("ada")
    browser.find_element(By.CSS_SELECTOR, "form[action='/signin'] button").click()
    wait(browser, lambda d: d.current_url.rstrip("/") == url, "the inbox after signing in")
    live(browser, "the inbox")
    card = browser.find_element(By.ID, f"p-{step}")
    assert "Launch of the spring catalogue" in card.text
    assert "due in" in card.text and "waiting" in card.text
    screenshot(browser, "console-inbox", tmp_path)

    # Fill in the form generated from the schema and approve: the decision's own
    # yes/no starts ticked (Approve means yes), the rest is filled in.
    assert card.find_element(By.NAME, "approved").is_selected()
    Select(card.find_element(By.NAME, "channel")).select_by_visible_text("newsletter")
    card.find_element(By.NAME, "note").send_keys("Lovely, ship it.")
    card.find_element(By.CSS_SELECTOR, "button.approve").click()
    wait(browser, lambda d: f"/workflows/{wid}" in d.current_url, "the timeline")
    wait(browser, lambda d: "Legal sign-off" in text_of(d, "#waiting"),
         "the workflow waiting for legal")  # fmt: skip
    assert "was recorded" in browser.page_source
    decided = client.decode(client.get(step).value)
    assert decided == {"approved": True, "channel": "newsletter", "note": "Lovely, ship it."}
    assert "by <b>ada</b>" in browser.page_source  # who settled what
    assert "started by newsroom" in browser.page_source
    live(browser, "the timeline")
    screenshot(browser, "console-timeline", tmp_path)

    # Legal signs off elsewhere: the open page updates itself, with no reload.
    browser.execute_script("window.trothMarker = 'same page'")
    with Client(client.address, timeout=10, principal="legal") as legal:
        legal.resolve(f"{wid}.2", {"ok": True})
    wait(browser, lambda d: text_of(d, "#root-state").lower() == "resolved",
         "the timeline showing the workflow resolved", timeout=60)  # fmt: skip
    assert browser.execute_script("return window.trothMarker") == "same page"
    assert "post 7 published on newsletter" in text_of(browser, "main")
    assert client.decode(client.get(wid).value) == "post 7 published on newsletter"
    screenshot(browser, "console-timeline-done", tmp_path)


def _exists(client: Client, id: str) -> bool:
    return bool(client.search(id).promises)
