"""The console's workflows in a real headless Chromium, served by the server process
itself (`troth serve --console-listen`): a paused run shown as paused with its error
and traceback, and the Retry now, Fail and Cancel buttons doing what they say; a
finished run's timeline still showing its named decision with who settled it; the
Workflows page and its filters. Screenshots: console-paused.png,
console-finished-timeline.png, console-workflows.png (TROTH_CONSOLE_SCREENSHOTS=DIR
writes them there too; `docs/images/` holds the docs', made so)."""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest
from _browser import chromium, live, screenshot, skip_without_chromium, steady, text_of, wait
from _console import hosted_console_url
from _support import eventually, start_server

from troth import Client, Context, PromiseState, Worker
from troth_server.settle_keys import new_keys_file

if TYPE_CHECKING:
    from pathlib import Path

    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

pytestmark = pytest.mark.e2e
skip_without_chromium()

from selenium.webdriver.common.by import By  # noqa: E402 (after the skip: selenium needs a browser)

GROUP = "console-workflows"
OTHER_GROUP = "console-billing"


def draft(post: int) -> str:
    return f"draft of post {post}"


def publish_post(ctx: Context, post: int) -> Generator[Any, Any, Any]:
    """The README's shape: a draft, a decision with an id of its own, a sleep."""
    text = yield ctx.run(draft, post)
    approval = yield ctx.promise(
        id=f"approval-{ctx.id}",
        title=f"Publish post {post}?",
        message=f"The editor wrote the {text}.",
        timeout=timedelta(hours=2),
    )
    decision = yield approval
    yield ctx.sleep(timedelta(milliseconds=10))
    return {"post": post, "decision": decision}


def nightly_invoice(ctx: Context, account: int) -> Generator[Any, Any, Any]:
    text = yield ctx.run(draft, account)
    return totl(text)  # type: ignore[name-defined]  # noqa: F821  # the bug: it pauses


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Client]]:
    """One `troth serve` process serving gRPC and the console; workers of two groups."""
    workdir = tmp_path_factory.mktemp("console-workflows")
    (workdir / "settle-keys.json").write_text(new_keys_file(["k1"]))
    server = start_server(
        workdir,
        "--console-listen", "127.0.0.1:0",
        "--settle-token-keys", str(workdir / "settle-keys.json"),
    )  # fmt: skip
    url = hosted_console_url(server)
    client = Client(server.address, timeout=10, principal="newsroom")
    workers = []
    for group in (GROUP, OTHER_GROUP):
        worker = Worker(Client(server.address, timeout=10, principal="bot"), group=group)
        worker.workflow(publish_post)
        worker.workflow(nightly_invoice)
        worker.start()
        workers.append(worker)
    try:
        yield url, client
    finally:
        for worker in workers:
            worker.stop()
        client.close()
        assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture
def browser(stack: tuple[str, Client]) -> Iterator[WebDriver]:
    url, _ = stack
    for driver in chromium():
        # The server runs without authentication: a name is enough to sign in.
        driver.get(f"{url}/signin")
        driver.find_element(By.NAME, "name").send_keys("olivia")
        driver.find_element(By.CSS_SELECTOR, "form[action='/signin'] button").click()
        wait(driver, lambda d: d.current_url.rstrip("/") == url, "the inbox after signing in")
        yield driver


def paused(client: Client, wid: str, group: str = GROUP, attempts: int = 1) -> bool:
    return any(
        t.root_id == wid and t.failed_attempts >= attempts for t in client.search_tasks(group)
    )


def attempts_of(client: Client, wid: str, group: str = GROUP) -> int:
    return max(
        (t.failed_attempts for t in client.search_tasks(group) if t.root_id == wid), default=0
    )


def next_retry_in(client: Client, wid: str, group: str = GROUP) -> float:
    """Seconds until the paused run's next attempt (0 if none is scheduled)."""
    for task in client.search_tasks(group):
        if task.root_id == wid and task.next_attempt_time is not None:
            return (task.next_attempt_time - datetime.now(UTC)).total_seconds()
    return 0.0


def fill(browser: WebDriver, form: str, reason: str) -> WebElement:
    """The form `form` with its reason typed in (the page holds still from then on)."""
    found = browser.find_element(By.CSS_SELECTOR, form)
    found.find_element(By.NAME, "reason").send_keys(reason)
    return found


def test_a_paused_run_shows_its_error_and_the_actions_retry_fail_and_cancel_it(
    stack: tuple[str, Client], browser: WebDriver, tmp_path: Path
) -> None:
    url, client = stack
    run = uuid.uuid4().hex[:6]
    ids = [f"invoice-{n}-{run}" for n in (1, 2, 3)]
    for n, wid in enumerate(ids, 1):
        client.start("nightly_invoice", n, id=wid, group=GROUP)
    for wid in ids:
        eventually(lambda wid=wid: paused(client, wid), 30, f"{wid} paused by its bug")

    # Paused, not "Running": the error, the attempts, the next retry, the traceback.
    eventually(lambda: paused(client, ids[0], attempts=3), 30, "three failed attempts")
    browser.get(f"{url}/workflows/{ids[0]}")
    live(browser, "the paused run")
    status = text_of(browser, "#waiting")
    assert "PAUSED after" in status and "failed attempt" in status, status
    assert "NameError: name 'totl' is not defined" in status
    assert "Next retry" in status or "trying it again now" in status
    assert "Running: a worker is on its next step" not in text_of(browser, "main")
    browser.find_element(By.CSS_SELECTOR, "#traceback summary").click()
    assert "totl" in text_of(browser, "#traceback pre")
    assert "Traceback" in text_of(browser, "#traceback pre")
    screenshot(browser, "console-paused", tmp_path)

    # Fail, with a reason: the root is rejected with it.
    browser.get(f"{url}/workflows/{ids[1]}")
    live(browser, "the run to fail")
    form = steady(
        lambda: fill(browser, f"form[action='/fail/{ids[1]}']", "the invoice run is retired")
    )
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait(browser, lambda d: "done=failed" in d.current_url, "the page after Fail")
    assert "was failed" in text_of(browser, "#done")
    assert text_of(browser, "#root-state").lower() == "rejected"
    root = client.get(ids[1])
    assert root.state is PromiseState.REJECTED
    assert client.decode(root.value)["message"] == "the invoice run is retired"

    # Cancel, with a reason: the root is cancelled.
    browser.get(f"{url}/workflows/{ids[2]}")
    live(browser, "the run to cancel")
    form = steady(lambda: fill(browser, f"form[action='/cancel/{ids[2]}']", "duplicate run"))
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait(browser, lambda d: "done=cancelled" in d.current_url, "the page after Cancel")
    assert text_of(browser, "#root-state").lower() == "rejected_canceled"
    assert client.get(ids[2]).state is PromiseState.REJECTED_CANCELED

    # Retry now: delivered at once, long before its backoff ends, it fails again
    # (the bug is still there).
    eventually(lambda: next_retry_in(client, ids[0]) > 3, 60, "a backoff of a few seconds")
    browser.get(f"{url}/workflows/{ids[0]}")
    live(browser, "the run to retry")
    before, backoff = attempts_of(client, ids[0]), next_retry_in(client, ids[0])
    steady(lambda: browser.find_element(By.CSS_SELECTOR, "button.retry").click())
    wait(browser, lambda d: "done=retried" in d.current_url, "the page after Retry now")
    assert "Retried now" in text_of(browser, "#done")
    eventually(lambda: attempts_of(client, ids[0]) > before, backoff - 1, "an attempt at once")

    # A Cancel of a run someone ended meanwhile is refused, in the server's words.
    browser.get(f"{url}/workflows/{ids[0]}")
    live(browser, "the paused run")
    form = steady(lambda: fill(browser, f"form[action='/cancel/{ids[0]}']", "again"))
    client.cancel(ids[0], {"reason": "cleaned up elsewhere"})
    form.find_element(By.CSS_SELECTOR, "button").click()
    wait(browser, lambda d: text_of(d, "#refused"), "the refusal")
    assert "Someone settled this promise already" in text_of(browser, "#refused")


def test_a_finished_runs_timeline_still_shows_its_named_decision_and_who_settled_it(
    stack: tuple[str, Client], browser: WebDriver, tmp_path: Path
) -> None:
    url, client = stack
    wid = f"review-post-{uuid.uuid4().hex[:6]}"
    client.start("publish_post", 21, id=wid, group=GROUP)
    approval = f"approval-{wid}"
    eventually(lambda: bool(client.search(approval).promises), 20, "the named decision")
    # Alice decides through a link (a settle token she minted), as from a mail.
    with Client(client.address, timeout=10, principal="alice") as alice:
        token = alice.mint_settle_token(approval)
    with Client(client.address, timeout=10) as link:
        link.resolve(approval, {"approved": True, "note": "ship it"}, settle_token=token)
    eventually(lambda: client.get(wid).state is PromiseState.RESOLVED, 30, "the run finished")

    browser.get(f"{url}/workflows/{wid}")
    live(browser, "the finished run")
    assert "Ended resolved" in text_of(browser, "#waiting")
    step = f"li[data-step='{approval}']"
    line = text_of(browser, step)
    assert "Publish post 21?" in line and "resolved" in line.lower()
    assert "by alice via settle-token k1:" in " ".join(line.split()), line
    assert '"approved": true' in line and '"note": "ship it"' in line
    kinds = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".timeline .kind")]
    assert kinds == ["WORKFLOW", "RUN", "PROMISE", "SLEEP"], kinds
    screenshot(browser, "console-finished-timeline", tmp_path)


def test_the_workflows_list_and_its_filters(
    stack: tuple[str, Client], browser: WebDriver, tmp_path: Path
) -> None:
    url, client = stack
    run = uuid.uuid4().hex[:6]
    waiting = [f"post-{n}-{run}" for n in (31, 32)]
    for n, wid in zip((31, 32), waiting, strict=True):
        client.start("publish_post", n, id=wid, group=GROUP)
    billing = f"invoice-9-{run}"
    client.start("nightly_invoice", 9, id=billing, group=OTHER_GROUP)
    for wid in waiting:
        eventually(lambda wid=wid: bool(client.search(f"approval-{wid}").promises), 20, wid)
    eventually(lambda: paused(client, billing, OTHER_GROUP), 30, "the billing run paused")

    browser.get(f"{url}/workflows")
    wait(browser, lambda d: text_of(d, "#workflows"), "the workflows list")
    shown = rows(browser)
    assert set(waiting) | {billing} <= set(shown), shown
    row = browser.find_element(By.CSS_SELECTOR, f"tr[data-workflow='{billing}']")
    assert "PAUSED" in row.text and "failed attempt" in row.text
    assert "console-billing" in row.text and "nightly_invoice@" in row.text
    row = browser.find_element(By.CSS_SELECTOR, f"tr[data-workflow='{waiting[0]}']")
    assert "Publish post 31?" in row.text and "PENDING" in row.text
    screenshot(browser, "console-workflows", tmp_path)

    # Paused only.
    browser.find_element(By.CSS_SELECTOR, "#filters input[name='paused']").click()
    browser.find_element(By.CSS_SELECTOR, "#filters button").click()
    wait(browser, lambda d: "paused=1" in d.current_url, "the paused filter applied")
    assert billing in rows(browser) and not set(waiting) & set(rows(browser))

    # Waiting for a human, in one group.
    browser.get(f"{url}/workflows")
    browser.find_element(By.CSS_SELECTOR, "#filters input[name='group']").send_keys(GROUP)
    browser.find_element(By.CSS_SELECTOR, "#filters input[name='human']").click()
    browser.find_element(By.CSS_SELECTOR, "#filters button").click()
    wait(browser, lambda d: "human=1" in d.current_url, "the human filter applied")
    assert set(waiting) <= set(rows(browser)) and billing not in rows(browser)
    assert all(r.startswith(("post-", "review-post-")) for r in rows(browser)), rows(browser)

    # A row leads to its workflow's page.
    browser.find_element(By.CSS_SELECTOR, f"tr[data-workflow='{waiting[1]}'] a").click()
    wait(browser, lambda d: f"/workflows/{waiting[1]}" in d.current_url, "the workflow's page")
    assert "Publish post 32?" in text_of(browser, "#waiting")


def rows(driver: WebDriver) -> list[str]:
    found = driver.execute_script(
        "return [...document.querySelectorAll('tr[data-workflow]')].map(r => r.dataset.workflow)"
    )
    return [str(one) for one in found]
