"""`troth console`'s routes over HTTP: a real `troth console` process, a real troth
server with authentication on (on SQLite and on PostgreSQL) and a real Worker: the
inbox and its schema forms, settling as the signed-in person (the approver policy
applies, refusals in words), the CSRF check, the workflow timeline, a paused run and
the Retry now / Fail / Cancel actions (the server's roles decide), the Workflows page
and its filters and pages, the tasks and workers pages."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Generator, Iterator
from contextlib import ExitStack
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from _auth import Grant, write_token_file
from _console import ConsoleProcess, start_console
from _pg import fresh_schema
from _support import eventually, start_server

from troth import Approvers, Client, Context, PromiseRejectedError, PromiseState, Worker
from troth.errors import ConfigurationError
from troth_server.console._app import build_app
from troth_server.console._config import ConsoleSettings

if TYPE_CHECKING:
    from pathlib import Path

    import httpx
    from _support import ServerProcess

GROUP = "console-editors"
DECISION = {
    "type": "object",
    "required": ["approved", "channel"],
    "properties": {
        "approved": {"type": "boolean"},
        "channel": {"enum": ["blog", "newsletter"], "title": "Channel"},
        "note": {"type": "string", "title": "Note"},
    },
}


def draft(post: int) -> str:
    return f"draft {post}"


def review(ctx: Context, post: int, approver: str) -> Generator[Any, Any, Any]:
    text = yield ctx.run(draft, post)
    approval = yield ctx.promise(
        title=f"Publish post {post}?",
        message=f"The editor wrote: {text}.",
        schema=DECISION,
        timeout=timedelta(hours=2),
        approvers=Approvers(principals=[approver]),
    )
    try:
        decision = yield approval
    except PromiseRejectedError as rejected:
        return {"rejected": rejected.value}
    return {"published": decision}


def gated(ctx: Context, approver: str) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(title="Gated", approvers=Approvers(principals=[approver]))
    return (yield approval)


def payout(ctx: Context, amount: int) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(
        title=f"Pay out {amount}?",
        approvers=Approvers(permissions=["payouts:approve"], not_requester=True),
    )
    return (yield approval)


def named(ctx: Context, post: int) -> Generator[Any, Any, Any]:
    approval = yield ctx.promise(id=f"approval-{ctx.id}", title=f"Named approval {post}")
    return (yield approval)


def noted(ctx: Context) -> Generator[Any, Any, Any]:
    yield ctx.set_state("notes", ["drafted"])
    approval = yield ctx.promise(title="Noted")
    return (yield approval)


def buggy(ctx: Context, post: int) -> Generator[Any, Any, Any]:
    yield ctx.run(draft, post)
    return publsh(post)  # type: ignore[name-defined]  # noqa: F821  # the bug: a pause


class Site:
    def __init__(
        self,
        server: ServerProcess,
        console: ConsoleProcess,
        tokens: dict[str, str],
        server_workdir: Path,
    ) -> None:
        self.server_workdir = server_workdir
        self.server = server
        self.console = console
        self.tokens = tokens

    def http(self) -> httpx.Client:
        return self.console.http()

    def sign_in(self, http: httpx.Client, name: str) -> None:
        response = http.post("/signin", data={"token": self.tokens[name], "csrf": csrf(http)})
        assert response.status_code == 303, response.text


def csrf(http: httpx.Client, path: str = "/signin") -> str:
    page = http.get(path).text
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, page[:2000]
    return found.group(1)


def key_of(page: str, promise_id: str) -> str:
    form = page[page.index(f'action="/settle/{promise_id}"') :]
    found = re.search(r'name="key" value="([^"]+)"', form)
    assert found
    return found.group(1)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def site(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Site]:
    """A server with authentication on, on each store, and `troth console` in front."""
    workdir = tmp_path_factory.mktemp("console")
    tokens = write_token_file(
        workdir / "tokens.toml",
        [
            Grant("worker", ("worker",), groups=(GROUP,)),
            Grant("starter", ("gateway",)),
            Grant("alice", ("gateway",)),
            Grant("bob", ("gateway",)),
            Grant("ops", ("operator",)),
            Grant("dave", ("gateway",)),  # revoked by a test: nobody else signs in as dave
            Grant("pam", ("gateway",), permissions=("payouts:approve", "payouts:read")),
        ],
    )
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"), db_url=db_url)
        console = start_console(workdir, server.address)
        try:
            yield Site(server, console, tokens, workdir)
        finally:
            assert console.stop() == 0, console.log()[-3000:]
            assert server.stop() == 0, server.log()[-3000:]


@pytest.fixture(scope="module")
def worker(site: Site) -> Iterator[Worker]:
    with Client(site.server.address, timeout=10, token=site.tokens["worker"]) as client:
        w = Worker(client, group=GROUP, lease=timedelta(seconds=5))
        w.workflow(review)
        w.workflow(named)
        w.workflow(payout)
        w.workflow(buggy)
        w.workflow(noted)
        w.start()
        yield w
        w.stop()


@pytest.fixture(scope="module")
def starter(site: Site) -> Iterator[Client]:
    with Client(site.server.address, timeout=10, token=site.tokens["starter"]) as client:
        yield client


def started(starter: Client, approver: str) -> tuple[str, str]:
    """A review waiting for `approver`: (workflow id, approval id)."""
    wid = f"review-{uuid.uuid4().hex[:8]}"
    starter.start("review", 7, approver, id=wid, group=GROUP)
    eventually(lambda: _pending(starter, f"{wid}.1"), 20, "the approval step")
    return wid, f"{wid}.1"


def _pending(client: Client, id: str) -> bool:
    return any(p.id == id for p in client.search(id, states=[PromiseState.PENDING]).promises)


def test_the_inbox_shows_the_approval_with_a_form_from_its_schema(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "alice")
        page = http.get("/")
    assert page.status_code == 200
    text = page.text
    assert "Publish post 7?" in text and "The editor wrote: draft 7." in text
    assert re.search(r"due in 1h59m|due in 2h", text), "the deadline in words"
    assert re.search(r"<dt>waiting</dt><dd>\d+s</dd>", text), "the age in words"
    assert f'href="/workflows/{wid}"' in text
    # The schema's fields: a checkbox, a required select of the enum, a text input.
    # The decision's own yes/no starts ticked: Approve on an untouched form means yes.
    assert re.search(r'type="checkbox" name="approved"\s+checked>', text)
    assert re.search(r'<select name="channel" required>', text)
    assert '<option value="&#34;blog&#34;" >blog</option>' in text
    assert 'name="note"' in text
    # Bob is not an approver: the inbox he sees (`mine`) does not hold it...
    with site.http() as http:
        site.sign_in(http, "bob")
        assert step not in http.get("/").text
        # ...and all pending approvals do.
        assert step in http.get("/?all=1").text


def test_approving_through_the_form_resumes_the_workflow_and_its_timeline_shows_who(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "alice")
        page = http.get("/").text
        form = {"csrf": csrf(http, "/"), "key": key_of(page, step), "action": "approve",
                "approved": "on", "channel": '"blog"', "note": "ship it"}  # fmt: skip
        response = http.post(f"/settle/{step}", data=form)
        assert response.status_code == 303
        assert response.headers["location"] == f"/workflows/{wid}?settled={step}"
        # A repeat of the same form (a double click) changes nothing.
        assert http.post(f"/settle/{step}", data=form).status_code == 303
        eventually(lambda: starter.get(wid).state is PromiseState.RESOLVED, 20, "the workflow")
        timeline = http.get(f"/workflows/{wid}?settled={step}").text
    decision = {"approved": True, "channel": "blog", "note": "ship it"}
    assert starter.decode(starter.get(wid).value) == {"published": decision}
    assert f"Your decision on <code>{step}</code> was recorded." in timeline
    kinds = re.findall(r'<span class="kind (\w+)">', timeline)
    assert kinds == ["workflow", "run", "promise"]
    assert "settled" in timeline and "by <b>alice</b>" in timeline
    assert "Ended resolved" in timeline


def test_the_workflow_page_shows_its_state_slots_as_rewritten(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid = f"noted-{uuid.uuid4().hex[:8]}"
    starter.start("noted", id=wid, group=GROUP)
    with Client(site.server.address, timeout=10, token=site.tokens["ops"]) as ops:

        def parked() -> bool:
            state = ops.get_state(wid, "notes")
            return bool(state.parked) and state.version == 1

        eventually(parked, 20, "the run parked")
        assert ops.replace_state(wid, "notes", lambda notes: [*notes, "reviewed"]).won
    with site.http() as http:
        site.sign_in(http, "ops")
        page = http.get(f"/workflows/{wid}").text
    section = page[
        page.index('<section class="states">') : page.index(
            "</section>", page.index('<section class="states">')
        )
    ]
    assert '<tr data-state="notes">' in section and "<td>2</td>" in section
    assert "by <b>ops</b>" in section and "reviewed" in section


def test_someone_the_policy_does_not_name_is_refused_in_words(
    site: Site, worker: Worker, starter: Client
) -> None:
    _, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "bob")
        page = http.get(f"/promises/{step}").text
        form = {"csrf": csrf(http, "/"), "key": key_of(page, step), "action": "approve",
                "channel": '"blog"'}  # fmt: skip
        refused = http.post(f"/settle/{step}", data=form)
    assert refused.status_code == 403
    assert "You are not one of the approvers of this promise" in refused.text
    assert 'action="/settle/' in refused.text, "the form again, to try as someone else"
    assert "NOT_AN_APPROVER" in refused.text
    assert starter.get(step).state is PromiseState.PENDING


def test_signed_in_shows_the_permissions_and_a_settle_is_decided_by_them(
    site: Site, worker: Worker, starter: Client
) -> None:
    with site.http() as http:
        site.sign_in(http, "pam")
        assert 'href="/me"' in http.get("/").text
        me = http.get("/me")
        assert me.status_code == 200
        assert "Signed in as <code>pam</code>" in me.text
        permissions = re.search(r'<dd id="permissions">(.*?)</dd>', me.text)
        assert permissions is not None
        assert re.findall(r"<code>([^<]+)</code>", permissions.group(1)) == [
            "payouts:approve",
            "payouts:read",
        ]
        assert "<code>gateway</code>" in me.text
    with site.http() as http:
        site.sign_in(http, "alice")
        assert re.search(r'<dd id="permissions">none</dd>', http.get("/me").text)
    wid = f"payout-{uuid.uuid4().hex[:8]}"
    starter.start("payout", 120, id=wid, group=GROUP)
    step = f"{wid}.0"
    eventually(lambda: _pending(starter, step), 20, "the approval step")
    with site.http() as http:  # alice holds no payouts:approve
        site.sign_in(http, "alice")
        assert step not in http.get("/").text  # her inbox (`mine`) lacks it
        page = http.get(f"/promises/{step}").text
        form = {"csrf": csrf(http, "/"), "key": key_of(page, step), "action": "reject"}
        refused = http.post(f"/settle/{step}", data=form)
        assert refused.status_code == 403 and "NOT_AN_APPROVER" in refused.text
    with site.http() as http:
        site.sign_in(http, "pam")
        page = http.get("/").text
        assert step in page  # pam's inbox holds it
        form = {"csrf": csrf(http, "/"), "key": key_of(page, step), "action": "reject"}
        assert http.post(f"/settle/{step}", data=form).status_code == 303
    eventually(lambda: starter.get(wid).state is PromiseState.REJECTED, 20, "the workflow")
    assert starter.get(step).settled_by == "pam"


def test_me_without_signing_in_sends_to_sign_in(site: Site) -> None:
    with site.http() as http:
        response = http.get("/me")
    assert response.status_code == 303 and response.headers["location"] == "/signin"


def test_a_form_missing_a_required_field_names_it_and_settles_nothing(
    site: Site, worker: Worker, starter: Client
) -> None:
    _, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "alice")
        form = {"csrf": csrf(http, "/"), "action": "approve", "channel": ""}
        response = http.post(f"/settle/{step}", data=form)
    assert response.status_code == 400
    assert "Channel is required" in response.text
    assert starter.get(step).state is PromiseState.PENDING


def test_a_post_without_the_csrf_value_is_refused(
    site: Site, worker: Worker, starter: Client
) -> None:
    _, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "alice")
        for sent in ({}, {"csrf": "x" * 43}):
            response = http.post(f"/settle/{step}", data={**sent, "action": "reject"})
            assert response.status_code == 403
            assert "CSRF" in response.text
    assert starter.get(step).state is PromiseState.PENDING


def test_rejecting_with_a_reason_reaches_the_workflow(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "alice")
        form = {"csrf": csrf(http, "/"), "action": "reject", "reason": "off-brand"}
        assert http.post(f"/settle/{step}", data=form).status_code == 303
    eventually(lambda: starter.get(wid).state is PromiseState.RESOLVED, 20, "the workflow")
    assert starter.decode(starter.get(wid).value) == {"rejected": {"reason": "off-brand"}}


def test_sign_in_sets_a_strict_http_only_cookie_and_refuses_a_bad_token(site: Site) -> None:
    with site.http() as http:
        token = csrf(http)
        bad = http.post("/signin", data={"token": "tr_nobody_secret", "csrf": token})
        assert bad.status_code == 401
        assert "The server" in bad.text and "token" in bad.text
        good = http.post("/signin", data={"token": site.tokens["alice"], "csrf": token})
        assert good.status_code == 303
        cookie = next(
            v for k, v in good.headers.multi_items() if k == "set-cookie" and "troth_token" in v
        )
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        out = http.post("/signout", data={"csrf": token})
        assert out.status_code == 303
        assert "Sign in" in http.get("/").text or http.get("/").status_code == 401


def test_not_signed_in_on_a_server_with_authentication_says_sign_in(site: Site) -> None:
    with site.http() as http:
        page = http.get("/")
    assert page.status_code == 401
    assert "The server did not accept your token" in page.text or "Sign in" in page.text
    assert 'href="/signin"' in page.text


def test_an_unknown_promise_is_not_found_in_words(site: Site) -> None:
    with site.http() as http:
        site.sign_in(http, "alice")
        page = http.get("/promises/no-such-promise")
    assert page.status_code == 404
    assert "There is no such promise" in page.text


def test_the_tasks_page_lists_a_groups_tasks(site: Site, starter: Client) -> None:
    wid = f"idle-{uuid.uuid4().hex[:8]}"
    starter.start("review", 8, "alice", id=wid, group="console-idle")  # no worker polls it
    with site.http() as http:
        site.sign_in(http, "ops")
        assert "worker group" in http.get("/tasks").text
        page = http.get("/tasks?group=console-idle")
    assert page.status_code == 200, page.text
    assert f'href="/workflows/{wid}"' in page.text
    row = page.text[page.text.index(f'href="/workflows/{wid}"') :]
    assert "<td>invoke</td>" in row and '<span class="state pending">pending</span>' in row
    assert "<td>review</td>" in row


def test_the_workers_page_lists_the_connected_workers(site: Site, worker: Worker) -> None:
    listed = f"<code>{worker.worker_id}</code>"
    with site.http() as http:
        site.sign_in(http, "ops")
        # `Worker.start()` returns before its stream is open (a loaded machine saw the
        # page read first): the page lists the worker once it is connected.
        eventually(lambda: listed in http.get("/workers").text, 20, "the worker connected")
        page = http.get("/workers")
    assert page.status_code == 200, page.text
    assert f"<code>{worker.worker_id}</code>" in page.text
    row = page.text[page.text.index(f"<code>{worker.worker_id}</code>") :]
    assert f">{GROUP}</a>" in row and "<td>worker</td>" in row, "its group and principal"
    assert "review " in row and "named " in row, "the workflows and versions it runs"
    assert " ago</td>" in row


@pytest.mark.parametrize("variable", ["TROTH_TOKEN", "TROTH_TOKEN_FILE"])
def test_the_console_never_sends_a_token_of_its_own(
    site: Site, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variable: str
) -> None:
    """Either variable would have the SDK's Client send its token for everyone not
    signed in: the console refuses to start with one set."""
    (tmp_path / "token").write_text(site.tokens["ops"])
    value = site.tokens["ops"] if variable == "TROTH_TOKEN" else str(tmp_path / "token")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError, match=f"{variable} is set"):
        build_app(ConsoleSettings(server=site.server.address))


def test_events_bridge_the_watch_stream_as_server_sent_events(site: Site, starter: Client) -> None:
    prefix = f"sse-{uuid.uuid4().hex[:8]}"
    with site.http() as http:
        site.sign_in(http, "alice")
        with http.stream("GET", "/events", params={"id": f"{prefix}*"}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.iter_lines()
            assert next(lines) == "event: ready"
            starter.create(f"{prefix}.a", ttl=timedelta(minutes=5))
            for line in lines:
                if line.startswith("data: ") and "CREATED" in line:
                    break
            assert f'"id": "{prefix}.a"' in line and '"state": "PENDING"' in line
            assert "live pages: 1" in http.get("/healthz").text
        # The browser went away: the console closes its watch.
        eventually(lambda: "live pages: 0" in http.get("/healthz").text, 20, "the watch closed")


def test_a_person_whose_token_is_revoked_is_refused_on_every_page_and_their_live_page_ends(
    site: Site, worker: Worker, starter: Client
) -> None:
    """The console is a road too (DESIGN §4 rule 15): a signed-in person whose token is
    removed from the token file (then SIGHUP) is refused on the next page and settle,
    and the live updates of a page they hold open stop."""
    import signal

    _, step = started(starter, "dave")
    path = site.server_workdir / "tokens.toml"
    with site.http() as http:
        site.sign_in(http, "dave")
        page = http.get(f"/promises/{step}").text
        form = {"csrf": csrf(http, "/"), "key": key_of(page, step), "action": "approve",
                "channel": '"blog"'}  # fmt: skip
        with http.stream("GET", "/events", params={"id": "review-*"}) as stream:
            lines = stream.iter_lines()
            assert next(lines) == "event: ready"
            entries = path.read_text().split("[[principal]]")
            path.write_text("[[principal]]".join(e for e in entries if '"dave"' not in e))
            site.server.proc.send_signal(signal.SIGHUP)
            # The page's live stream ends (the server ends the watch within a second).
            for _ in lines:
                pass
        refused = http.get("/")
        assert refused.status_code == 401, refused.text[:500]
        # TOKEN_UNKNOWN in words, or, when the call was cut off by the server ending
        # the person's stream for the same reason, the refusal of the token in words.
        assert (
            "The server does not know your token" in refused.text
            or "The server did not accept your token" in refused.text
        ), refused.text[-1500:]
        posted = http.post(f"/settle/{step}", data=form)
        assert posted.status_code == 401, posted.text[:500]
    assert starter.get(step).state is PromiseState.PENDING


def test_the_timeline_shows_a_pending_step_with_an_id_of_its_own_as_the_waiting_point(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid = f"named-{uuid.uuid4().hex[:8]}"
    starter.start("named", 9, id=wid, group=GROUP)
    eventually(lambda: _pending(starter, f"approval-{wid}"), 20, "the named approval")
    with site.http() as http:
        site.sign_in(http, "alice")
        page = http.get(f"/workflows/{wid}").text
    assert f'href="/promises/approval-{wid}">Named approval 9</a>' in page
    with site.http() as http:
        site.sign_in(http, "alice")
        root = http.get(f"/promises/{wid}").text
    assert "Your decision" not in root, "a workflow's root is not decided in the console"
    assert "Waiting for\n" in page or "Waiting for" in page
    assert "waiting for a decision" in page


def test_a_finished_runs_timeline_still_shows_its_named_decision_and_who_made_it(
    site: Site, worker: Worker, starter: Client
) -> None:
    """A step with an id of its own (`ctx.promise(id=...)`) is the workflow's by its
    parent link, not by an id under `<workflow>.`: after the run ends it stays on the
    timeline, with who settled it and the value."""
    wid = f"named-{uuid.uuid4().hex[:8]}"
    starter.start("named", 10, id=wid, group=GROUP)
    eventually(lambda: _pending(starter, f"approval-{wid}"), 20, "the named approval")
    with Client(site.server.address, timeout=10, token=site.tokens["alice"]) as alice:
        alice.resolve(f"approval-{wid}", {"approved": True, "by": "alice"})
    eventually(lambda: starter.get(wid).state is PromiseState.RESOLVED, 20, "the workflow")
    with site.http() as http:
        site.sign_in(http, "bob")
        page = http.get(f"/workflows/{wid}").text
    assert "Ended resolved" in page
    assert f'data-step="approval-{wid}"' in page, "the decision vanished from the timeline"
    step = page[page.index(f'data-step="approval-{wid}"') :]
    step = step[: step.index("</li>")]
    assert "by <b>alice</b>" in step
    assert "&#34;approved&#34;: true" in step or "&quot;approved&quot;: true" in step, step


def test_a_decision_on_a_run_whose_version_is_gone_says_the_run_waits_for_it(
    site: Site, starter: Client
) -> None:
    wid = f"gated-{uuid.uuid4().hex[:8]}"
    with Client(site.server.address, timeout=10, token=site.tokens["worker"]) as client:
        old = Worker(client, group=GROUP, worker_id=f"old-{wid}", lease=timedelta(seconds=5))
        old.workflow(gated)
        old.start()
        try:
            eventually(lambda: _connected(site, f"old-{wid}"), 20, "the old worker connected")
            starter.start("gated", "alice", id=wid, group=GROUP)
            eventually(lambda: _pending(starter, f"{wid}.0"), 20, "the approval step")
        finally:
            old.stop()  # the only worker of its version goes away
    eventually(lambda: _gone(site, f"old-{wid}"), 15, "the old worker gone")
    with site.http() as http:
        site.sign_in(http, "alice")  # a gateway: she may not read tasks
        page = http.get(f"/promises/{wid}.0").text
        form = {"csrf": csrf(http, f"/promises/{wid}.0"), "key": key_of(page, f"{wid}.0"),
                "action": "approve", "troth.raw": "true"}  # fmt: skip
        response = http.post(f"/settle/{wid}.0", data=form)
        assert response.status_code == 303, response.text
        landed = http.get(response.headers["location"]).text
        assert f"Your decision on <code>{wid}.0</code> was recorded." in landed
        assert "The workflow cannot go on yet: waiting for a worker of group" in landed
        assert "(none connected since" in landed
        assert "an operator can move it" in landed and "/move/" not in landed
        # Once seen, the note is gone; an operator sees the wait from the task, and the button.
        assert "cannot go on yet" not in http.get(response.headers["location"]).text
    with site.http() as http:
        site.sign_in(http, "ops")
        shown = http.get(f"/workflows/{wid}").text
    assert "waiting for a worker of group" in shown and f'action="/move/{wid}"' in shown


def _gone(site: Site, worker_id: str) -> bool:
    """The server logged the end of the worker's stream: it routes without it from then."""
    return _logged(site, "worker.disconnected", worker_id)


def _connected(site: Site, worker_id: str) -> bool:
    """The server logged the worker's stream: a workflow only it registers goes to it
    (started before, a workflow no connected worker knows goes to any worker of the
    group, which rejects it as unknown)."""
    return _logged(site, "worker.connected", worker_id)


def _logged(site: Site, event: str, worker_id: str) -> bool:
    for line in site.server.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == event and entry.get("worker_id") == worker_id:
            return True
    return False


def paused_run(site: Site, starter: Client) -> str:
    """A `buggy` run, paused by its NameError (its task failed at least once)."""
    wid = f"buggy-{uuid.uuid4().hex[:8]}"
    starter.start("buggy", 3, id=wid, group=GROUP)
    with Client(site.server.address, timeout=10, token=site.tokens["ops"]) as ops:
        eventually(lambda: _failed(ops, wid), 30, "the run paused by its bug")
    return wid


def _failed(ops: Client, wid: str) -> bool:
    return any(t.root_id == wid and t.failed_attempts for t in ops.search_tasks(GROUP))


def test_a_paused_run_shows_paused_with_its_error_attempts_traceback_and_actions(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid = paused_run(site, starter)
    with site.http() as http:
        site.sign_in(http, "ops")
        page = http.get(f"/workflows/{wid}").text
    assert "Running: a worker is on its next step" not in page
    assert re.search(r"<b>PAUSED</b> after \d+ failed attempts?", page), page[-3000:]
    assert "NameError: name &#39;publsh&#39; is not defined" in page
    assert re.search(r"Next retry \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC|trying it again now", page)
    assert '<details id="traceback"><summary>Traceback</summary>' in page and "publsh" in page
    for action in ("retry", "fail", "cancel"):
        assert f'action="/{action}/{wid}"' in page


def test_a_person_whose_roles_may_not_operate_sees_no_buttons_and_is_refused_in_words(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid = paused_run(site, starter)
    with site.http() as http:
        site.sign_in(http, "alice")  # a gateway: may not fail, cancel or read tasks
        page = http.get(f"/workflows/{wid}").text
        assert "<b>PAUSED</b> after" in page, "anyone who may read the run sees it paused"
        assert 'action="/fail/' not in page and 'action="/cancel/' not in page
        form = {"csrf": csrf(http, f"/workflows/{wid}"), "reason": "not mine to fail"}
        for action in ("fail", "cancel", "retry"):
            refused = http.post(f"/{action}/{wid}", data=form)
            assert refused.status_code == 403, (action, refused.text[-2000:])
            assert "Your roles do not allow this" in refused.text, refused.text[-2000:]
            assert "(ROLE_NOT_ALLOWED)" in refused.text
    assert starter.get(wid).state is PromiseState.PENDING


def test_an_operator_fails_a_paused_run_with_a_reason(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid = paused_run(site, starter)
    with site.http() as http:
        site.sign_in(http, "ops")
        token = csrf(http, f"/workflows/{wid}")
        empty = http.post(f"/fail/{wid}", data={"csrf": token, "reason": " "})
        assert empty.status_code == 400 and "Give a reason" in empty.text
        done = http.post(f"/fail/{wid}", data={"csrf": token, "reason": "a bug, fixed tomorrow"})
        assert done.status_code == 303, done.text[-2000:]
        assert done.headers["location"] == f"/workflows/{wid}?done=failed"
        page = http.get(done.headers["location"]).text
    assert "The workflow was failed" in page and "Ended rejected" in page
    root = starter.get(wid)
    assert root.state is PromiseState.REJECTED
    assert starter.decode(root.value)["message"] == "a bug, fixed tomorrow"


def test_an_operator_cancels_a_run_and_a_second_cancel_is_refused_in_words(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid, step = started(starter, "alice")  # waiting for a decision: no task
    with site.http() as http:
        site.sign_in(http, "ops")
        page = http.get(f"/workflows/{wid}").text
        assert f'action="/cancel/{wid}"' in page and f'action="/retry/{wid}"' not in page
        form = {"csrf": csrf(http, f"/workflows/{wid}"), "reason": "the post was withdrawn"}
        done = http.post(f"/cancel/{wid}", data=form)
        assert done.status_code == 303, done.text[-2000:]
        assert "was cancelled" in http.get(done.headers["location"]).text
        again = http.post(f"/cancel/{wid}", data=form)
    assert again.status_code == 409, again.text[-2000:]
    assert "Someone settled this promise already" in again.text
    assert starter.get(wid).state is PromiseState.REJECTED_CANCELED
    assert starter.get(step).state is PromiseState.REJECTED_CANCELED
    assert starter.decode(starter.get(wid).value) == {"reason": "the post was withdrawn"}


def test_an_operator_retries_a_paused_run_now_and_one_not_paused_is_refused_in_words(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid = paused_run(site, starter)
    waiting, _ = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "ops")
        token = csrf(http, f"/workflows/{wid}")
        done = http.post(f"/retry/{wid}", data={"csrf": token})
        assert done.status_code == 303, done.text[-2000:]
        assert "Retried now" in http.get(done.headers["location"]).text
        refused = http.post(f"/retry/{waiting}", data={"csrf": token})
    assert refused.status_code == 409, refused.text[-2000:]
    assert "(WORKFLOW_NOT_PAUSED)" in refused.text


IDLE = "console-idle"
"""A group no worker polls: its workflows wait, in the order they were started."""


def test_the_workflows_page_lists_runs_with_their_state_and_what_they_wait_on_by_filter(
    site: Site, worker: Worker, starter: Client
) -> None:
    wid_paused = paused_run(site, starter)
    wid_human, step = started(starter, "alice")
    with site.http() as http:
        site.sign_in(http, "bob")  # a gateway reads the list too
        everything = http.get("/workflows")
        paused = http.get(f"/workflows?paused=1&group={GROUP}").text
        human = http.get("/workflows?human=1&workflow=review").text
        named = http.get("/workflows?workflow=named&state=resolved").text
        future = http.get("/workflows?after=2999-01-01T00:00").text
        bad = http.get("/workflows?state=sleepy")
        odd = http.get("/workflows?before=yesterday")
    assert everything.status_code == 200
    assert 'href="/workflows" aria-current="page">Workflows</a>' in everything.text
    assert wid_paused in everything.text and wid_human in everything.text
    row = paused[paused.index(f'data-workflow="{wid_paused}"') :][:1500]
    assert '<span class="state paused"' in row and re.search(r"\d+ failed attempts?", row)
    assert "<code>buggy@" in row and GROUP in row
    assert wid_human not in paused
    row = human[human.index(f'data-workflow="{wid_human}"') :][:1500]
    assert f'href="/promises/{step}" class="decision-link">Publish post 7?</a>' in row
    assert wid_paused not in human
    assert wid_human not in named and wid_paused not in named
    assert "No workflow matches these filters." in future
    assert bad.status_code == 200 and "state &#39;SLEEPY&#39; is not one of" in bad.text
    assert "is not a date and time" in odd.text


def test_the_workflows_page_pages_newest_first(site: Site, starter: Client) -> None:
    run = uuid.uuid4().hex[:6]
    ids = [f"idle-{run}-{n:02}" for n in range(52)]
    for wid in ids:
        starter.start("anything", id=wid, group=IDLE)
    with site.http() as http:
        site.sign_in(http, "bob")
        first = http.get(f"/workflows?group={IDLE}&id=idle-{run}-*").text
        older = re.search(r'href="/workflows\?([^"]+)" rel="next"', first)
        assert older, first[-2000:]
        second = http.get(f"/workflows?{older.group(1).replace('&amp;', '&')}").text
    shown = re.findall(r'data-workflow="(idle-[^"]+)"', first)
    assert shown == ids[::-1][:50]
    assert re.findall(r'data-workflow="(idle-[^"]+)"', second) == ids[::-1][50:]
    assert 'rel="prev"' in second and 'rel="next"' not in second
    assert "waiting for a worker of group" in first or "a worker of its group" in first


def test_a_run_no_worker_has_taken_says_it_waits_for_one_not_that_it_runs(
    site: Site, starter: Client
) -> None:
    wid = f"idle-{uuid.uuid4().hex[:8]}"
    starter.start("anything", id=wid, group=IDLE)
    with site.http() as http:
        site.sign_in(http, "bob")
        page = http.get(f"/workflows/{wid}").text
        assert http.get("/workflows/").headers["location"] == "/workflows"
    assert "Running: a worker is on its next step" not in page
    assert re.search(r'id="waiting">Waiting for a worker: [^<]*console-idle', page), page[-3000:]
