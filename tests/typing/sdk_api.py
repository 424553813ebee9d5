"""Typing contract: what users write against the public SDK must type-check (mypy --strict).

Not run by pytest; `make typecheck` checks it, so a change to the public API
that breaks users' type checking fails CI.
"""

from __future__ import annotations

from datetime import timedelta

import troth
from troth import Client, JsonCodec, Promise, PromiseState


def gateway(client: Client) -> bool:
    created: troth.CreateResult = client.create(
        "approve-7", {"post": 7}, ttl=timedelta(days=3), tags={"team": "editors"}
    )
    promise: Promise = created.promise
    if not created.created:
        return False
    try:
        settled: troth.SettleResult = client.resolve(promise.id, {"approved": True})
    except troth.AlreadySettledError as exc:
        print(exc.promise_id, exc.state)
        return False
    assert settled.applied
    final = client.wait(promise.id, timeout=30)
    value: object = client.decode(final.value)
    print(value)
    return final.state is PromiseState.RESOLVED


def search(client: Client) -> list[str]:
    page: troth.SearchPage = client.search("approve-*", states=[PromiseState.PENDING])
    ids = [p.id for p in page.promises]
    ids += [p.id for p in client.search_all("other-*", tags={"team": "editors"})]
    return ids


def inbox(client: Client) -> dict[str, Promise]:
    wanted = {"troth:kind": "promise"}
    pending = {
        p.id: p
        for p in client.search_all(
            states=["PENDING"], tags=wanted, order=troth.PromiseOrder.EXPIRE_TIME_ASC
        )
    }
    old: troth.SearchPage = client.search(order="CREATED_DESC", older_than=timedelta(hours=2))
    print(len(old.promises))
    stream: troth.PromiseEventStream = client.watch_promises(tags=wanted, on_reconnect=print)
    with stream as events:
        for event in events:
            item: troth.PromiseEvent = event
            if item.type is troth.PromiseEventType.CREATED:
                pending[item.promise.id] = item.promise
            else:
                pending.pop(item.promise.id, None)
    return pending


def custom_codec() -> Client:
    return Client("127.0.0.1:7070", codec=JsonCodec(), timeout=5.0, principal="gateway")


def secure_clients() -> list[Client]:
    from pathlib import Path

    mtls = troth.TlsConfig(
        ca_file=Path("tls/ca.pem"), cert_file="tls/alice.crt", key_file="tls/alice.key"
    )
    tls: troth.TlsConfig | None = Client("h:7070", tls=mtls, token="t0k").tls
    print(tls.mutual if tls else None)
    return [
        Client("troth.example:7070", tls=True, token="t0k"),
        Client("10.0.0.1:7070", tls=troth.TlsConfig(server_name="troth.internal")),
        Client("10.0.0.1:7070", token="t0k", allow_plaintext_token=True),
    ]


def operator(client: Client) -> None:
    """The workflows an operator lists, a paused one retried, a timeline read."""
    paused: list[troth.WorkflowInfo] = client.search_workflows(
        group="editors", states=[PromiseState.PENDING, "RESOLVED"], paused=True, limit=50
    )
    for workflow in paused:
        if workflow.paused and workflow.task is not None:
            print(workflow.id, workflow.state, workflow.task.last_error)
            task: troth.TaskInfo = client.retry_workflow_now(workflow.id)
            print(task.next_attempt_time)
    for waiting in client.iter_workflows(waiting_for_human=True, newest_first=False):
        decisions: list[Promise] = waiting.waiting_on
        print(waiting.root.id, waiting.group, waiting.workflow, waiting.version, decisions)
    steps: list[Promise] = client.workflow_steps("publish-7")
    print([step.settled_by for step in steps])


def payouts(client: Client) -> tuple[str, ...]:
    """A policy of permission names, and who the client is to the server."""
    policy = troth.Approvers(permissions=["payouts:approve"], not_requester=True)
    client.create("payout-1", {"amount": 120}, approvers=policy)
    me: troth.Caller = client.whoami()
    print(me.name, me.roles, me.authenticated)
    return me.permissions


def rewrite_state(client: Client) -> bool:
    """An operator reads a parked run's state slot and rewrites it, a validator guarding it."""
    state: troth.WorkflowState = client.get_state("chat-1", "thread")
    if not state.parked:
        print(state.not_parked_because)

    def shrink(thread: list[str]) -> list[str]:
        return thread[-10:]

    def non_empty(thread: list[str]) -> None:
        if not thread:
            raise ValueError("empty")

    replaced: troth.StateReplaced = client.replace_state(
        "chat-1", "thread", shrink, validate=non_empty
    )
    if not replaced.won:
        lost: troth.StateLostTo = replaced.lost_to
        print(lost.value, replaced.message, replaced.state.version, replaced.based_on)
    return replaced.won
