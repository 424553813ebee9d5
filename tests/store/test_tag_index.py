"""The tag index (`promise_tags`, revision 0015) on SQLite and PostgreSQL: its rows follow
each promise's tags through create, an early settle's adoption and retention, the
upgrade fills it from the tags already stored, and a search by tag finds what the
promises' own tags say, in either order, page after page, with long tags too."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
from _pg import fresh_schema
from alembic import command

from troth_server.domain.promise import EMPTY, Promise, PromiseState
from troth_server.store import PromiseOrder, PromiseQuery, Store, WriteTx, open_store
from troth_server.store._migrate import alembic_config
from troth_server.store._tables import TAG_VALUE_INDEXED

T0 = 1_767_225_600_000


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 't.db'}"
    else:
        with fresh_schema(migrate=False) as url:
            yield url


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    opened = open_store(db_url, migrate=True)
    yield opened
    opened.close()


def _promise(promise_id: str, tags: dict[str, str], **changes: object) -> Promise:
    base = Promise(
        id=promise_id, state=PromiseState.PENDING, param=EMPTY, value=EMPTY, tags=tags,
        create_time=T0,
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def _ids(store: Store, tags: dict[str, str], **query: object) -> list[str]:
    """Every id a search by `tags` finds, page by page (pages of 2)."""
    found: list[str] = []
    after = 0
    id_glob = str(query.pop("id_glob", ""))
    while True:
        search = PromiseQuery(id_glob, frozenset(), tags, after, 2, **query)  # type: ignore[arg-type]
        rows = store.search_promises(search, T0)
        found += [r.promise.id for r in rows]
        if len(rows) < 2:
            return found
        after = rows[-1].seq


def _tag_rows(db_url: str) -> set[tuple[str, str, str]]:
    """(promise id, key, value) of every row of the tag index."""
    engine = sa.create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT p.id, t.key, t.value FROM promise_tags t"
                    " LEFT JOIN promises p ON p.seq = t.seq"
                )
            ).all()
    finally:
        engine.dispose()
    return {(r[0], r[1], r[2]) for r in rows}


def test_a_search_by_tag_finds_what_the_tags_say_in_either_order(store: Store) -> None:
    store.write(
        lambda tx: tx.insert_promises(
            [
                _promise(f"p{n}", {"team": f"t{n % 3}", "env": "prod" if n % 2 else "dev"})
                for n in range(12)
            ]
            + [_promise("untagged", {})]
        )
    )
    t1 = [f"p{n}" for n in range(12) if n % 3 == 1]
    assert _ids(store, {"team": "t1"}) == t1
    assert _ids(store, {"team": "t1"}, order=PromiseOrder.CREATED_DESC) == t1[::-1]
    assert _ids(store, {"team": "t1", "env": "prod"}) == [f"p{n}" for n in (1, 7)]
    assert _ids(store, {"team": "t1"}, order=PromiseOrder.EXPIRE_TIME_ASC) == t1
    assert _ids(store, {"team": "t9"}) == []
    assert _ids(store, {"team": "t1"}, id_glob="p1*") == ["p1", "p10"]


def test_the_index_follows_an_early_settle_adopted_by_its_create(store: Store, db_url: str) -> None:
    early = _promise("early", {"troth:early": "true"}, state=PromiseState.RESOLVED, settle_time=T0)
    store.write(lambda tx: tx.insert_promises([early]))
    assert _ids(store, {"troth:early": "true"}) == ["early"]
    adopted = replace(early, tags={"team": "t1", "kind": "approval"})
    store.write(lambda tx: tx.update_promises([adopted]))
    assert _ids(store, {"troth:early": "true"}) == []
    assert _ids(store, {"team": "t1"}) == ["early"]
    assert _ids(store, {"kind": "approval", "team": "t1"}) == ["early"]
    # A value changed under the same key, and an update that changes no tag.
    store.write(lambda tx: tx.update_promises([replace(adopted, tags={"team": "t2"})]))
    store.write(lambda tx: tx.update_promises([replace(adopted, tags={"team": "t2"})]))
    assert _ids(store, {"team": "t1"}) == []
    assert _ids(store, {"team": "t2"}) == ["early"]
    assert _tag_rows(db_url) == {("early", "team", "t2")}


def test_the_index_follows_tags_changed_twice_in_one_transaction(store: Store, db_url: str) -> None:
    early = _promise("early", {"troth:early": "true"}, state=PromiseState.RESOLVED, settle_time=T0)
    store.write(lambda tx: tx.insert_promises([early]))

    def twice(tx: WriteTx) -> None:
        (read,) = tx.get_promises(["early"]).values()
        tx.update_promises([replace(read, tags={"team": "t1"})])
        tx.update_promises([read])  # back to the tags it read

    store.write(twice)
    assert _ids(store, {"troth:early": "true"}) == ["early"]
    assert _ids(store, {"team": "t1"}) == []
    assert _tag_rows(db_url) == {("early", "troth:early", "true")}


def test_retention_deletes_a_promises_tag_rows_with_it(store: Store, db_url: str) -> None:
    root_tags = {"troth:invoke": "g", "troth:func": "wf", "team": "t1"}
    settled = {"state": PromiseState.RESOLVED, "settle_time": T0 + 1}
    store.write(
        lambda tx: tx.insert_promises(
            [
                _promise("alone", {"team": "t1"}, **settled),
                _promise("wf", root_tags, **settled),
                _promise("wf.0", {"troth:kind": "run"}, root_id="wf", parent_id="wf", **settled),
                _promise("kept", {"team": "t1"}),
            ]
        )
    )
    batch = store.write(lambda tx: tx.prune_settled(T0 + 10, None, 100, delete=True))
    assert batch.promises == 3
    assert _ids(store, {"team": "t1"}) == ["kept"]
    assert _tag_rows(db_url) == {("kept", "team", "t1")}


def test_a_tag_too_long_for_the_index_is_still_found(store: Store, db_url: str) -> None:
    long = "v" * (TAG_VALUE_INDEXED + 1)
    store.write(
        lambda tx: tx.insert_promises(
            [_promise("a", {"note": long, "team": "t1"}), _promise("b", {"note": long})]
        )
    )
    assert _ids(store, {"note": long}) == ["a", "b"]
    assert _ids(store, {"note": long, "team": "t1"}) == ["a"]
    assert _tag_rows(db_url) == {("a", "team", "t1")}


def test_the_upgrade_fills_the_index_from_the_tags_stored(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    try:
        with engine.begin() as conn:
            config = alembic_config(conn)
            command.upgrade(config, "0013")
            insert = sa.text(
                "INSERT INTO promises (id, state, param_headers, param_data, value_headers,"
                " value_data, tags, timer, create_time) VALUES (:id, 'PENDING', '{}', :b, '{}',"
                " :b, :tags, false, 1)"
            )
            for promise_id, tags in (
                ("a", '{"team": "t1", "env": "prod"}'),
                ("b", "{}"),
                ("c", '{"team": "t1", "note": "' + "v" * (TAG_VALUE_INDEXED + 1) + '"}'),
            ):
                conn.execute(insert, {"id": promise_id, "tags": tags, "b": b""})
            command.upgrade(config, "head")
    finally:
        engine.dispose()
    assert _tag_rows(db_url) == {("a", "team", "t1"), ("a", "env", "prod"), ("c", "team", "t1")}
    store = open_store(db_url)
    try:
        assert _ids(store, {"team": "t1"}) == ["a", "c"]
    finally:
        store.close()
