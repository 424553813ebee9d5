"""The console's Schedules page over HTTP: a real `troth console` in front of a real
server with authentication on (SQLite and PostgreSQL): an operator lists schedules and
pauses and resumes them as themself; a gateway is refused in words, on the page and on
the buttons; a post without the CSRF value changes nothing."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING

import pytest
from _auth import Grant, write_token_file
from _console import ConsoleProcess, start_console
from _pg import fresh_schema
from _support import start_server

from troth import Client

if TYPE_CHECKING:
    import httpx
    from _support import ServerProcess


class Site:
    def __init__(self, server: ServerProcess, console: ConsoleProcess, tokens: dict[str, str]):
        self.server, self.console, self.tokens = server, console, tokens

    def signed_in(self, http: httpx.Client, name: str) -> None:
        response = http.post("/signin", data={"token": self.tokens[name], "csrf": csrf(http)})
        assert response.status_code == 303, response.text

    def client(self, name: str) -> Client:
        return Client(self.server.address, timeout=10, token=self.tokens[name])


def csrf(http: httpx.Client, path: str = "/signin") -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', http.get(path).text)
    assert found
    return found.group(1)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def site(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Site]:
    workdir = tmp_path_factory.mktemp("console-schedules")
    tokens = write_token_file(
        workdir / "tokens.toml", [Grant("ops", ("operator",)), Grant("alice", ("gateway",))]
    )
    with ExitStack() as stack:
        db_url = stack.enter_context(fresh_schema()) if request.param == "postgres" else None
        server = start_server(workdir, "--auth-tokens", str(workdir / "tokens.toml"), db_url=db_url)
        console = start_console(workdir, server.address)
        try:
            yield Site(server, console, tokens)
        finally:
            assert console.stop() == 0, console.log()[-3000:]
            assert server.stop() == 0, server.log()[-3000:]


def test_an_operator_lists_pauses_and_resumes_schedules(site: Site) -> None:
    name = f"nightly-{uuid.uuid4().hex[:6]}"
    with site.client("ops") as ops:
        ops.schedules.create(name, "report", "sales", cron="0 2 * * *", timezone="Europe/Paris")
    with site.console.http() as http:
        site.signed_in(http, "ops")
        page = http.get("/schedules").text
        assert f"<code>{name}</code>" in page and "Europe/Paris" in page
        assert f'action="/pause-schedule/{name}"' in page
        token = csrf(http, "/schedules")
        paused = http.post(f"/pause-schedule/{name}", data={"csrf": token})
        assert paused.status_code == 303, paused.text[-2000:]
        page = http.get(paused.headers["location"]).text
        assert f"Schedule {name} paused." in page and f'action="/resume-schedule/{name}"' in page
        resumed = http.post(f"/resume-schedule/{name}", data={"csrf": token})
        assert resumed.status_code == 303
        assert f"Schedule {name} resumed." in http.get(resumed.headers["location"]).text
    with site.client("ops") as ops:
        assert not ops.schedules.get(name).paused


def test_a_gateway_is_refused_in_words_and_changes_nothing(site: Site) -> None:
    name = f"guarded-{uuid.uuid4().hex[:6]}"
    with site.client("ops") as ops:
        ops.schedules.create(name, "report", cron="0 * * * *")
    with site.console.http() as http:
        site.signed_in(http, "alice")
        page = http.get("/schedules")
        assert page.status_code == 403
        assert "Your roles do not allow this" in page.text and "(ROLE_NOT_ALLOWED)" in page.text
        refused = http.post(f"/pause-schedule/{name}", data={"csrf": csrf(http, "/")})
        assert refused.status_code == 403, refused.text[-2000:]
        assert "(ROLE_NOT_ALLOWED)" in refused.text
    with site.console.http() as http:
        site.signed_in(http, "ops")
        forged = http.post(f"/pause-schedule/{name}", data={"csrf": "not-it"})
        assert forged.status_code == 403
    with site.client("ops") as ops:
        assert not ops.schedules.get(name).paused
