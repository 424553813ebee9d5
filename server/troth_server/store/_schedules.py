"""Schedules in the store (revision 0017): the scheduler's read of what is due, locked
in the writer's transaction (`ScheduleTx`, mixed into it), and the reads of the
schedules for the API (`ScheduleReads`, mixed into the store).

What is due is read through `ix_schedules_due` (the active schedules by fire time;
tests/store/test_schedules_store.py checks the plan), locked and skipping rows another
replica's transaction holds, so that each schedule is advanced by one replica at a time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import bindparam, delete, func, insert, select, update

from troth_server.domain.promise import Payload
from troth_server.domain.schedules import CatchUp, Schedule, ScheduleSpec
from troth_server.store._rows import dump_json, load_json
from troth_server.store._tables import schedules

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sqlalchemy import Connection

__all__ = ["ScheduleReads", "ScheduleTx", "select_due", "soonest"]

T = TypeVar("T")

_s = schedules.c
select_due = (
    select(schedules)
    .where(_s.next_fire_time.is_not(None), _s.next_fire_time <= bindparam("now"))
    .order_by(_s.next_fire_time)
    .limit(bindparam("limit"))
)
"""The active schedules whose next tick fires at or before `now`, soonest first."""
_SELECT_DUE_LOCKED = select_due.with_for_update(skip_locked=True)
_by_name = select(schedules).where(_s.name == bindparam("name"))
_page = (
    select(schedules)
    .where(_s.name > bindparam("after"))
    .order_by(_s.name)
    .limit(bindparam("limit"))
)
_update = update(schedules).where(_s.name == bindparam("b_name"))
soonest = select(func.min(_s.next_fire_time)).where(_s.next_fire_time.is_not(None))
"""When the soonest active schedule fires: the first entry of `ix_schedules_due`."""


def to_row(schedule: Schedule) -> dict[str, Any]:
    spec = schedule.spec
    return {
        "name": spec.name,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "workflow": spec.workflow,
        "group": spec.group,
        "args_headers": dump_json(spec.args.headers),
        "args_data": spec.args.data,
        "catch_up": spec.catch_up.value,
        "jitter_ms": spec.jitter_ms,
        "ttl_ms": spec.ttl_ms,
        "paused": schedule.paused,
        "next_tick": schedule.next_tick,
        "next_fire_time": schedule.next_fire_time,
        "last_tick": schedule.last_tick,
        "last_run_id": schedule.last_run_id,
        "skipped": schedule.skipped,
        "created_by": schedule.created_by,
        "create_time": schedule.create_time,
        "update_time": schedule.update_time,
    }


def to_schedule(row: Any) -> Schedule:
    spec = ScheduleSpec(
        name=row["name"],
        cron=row["cron"],
        workflow=row["workflow"],
        group=row["group"],
        args=Payload(headers=load_json(row["args_headers"]), data=bytes(row["args_data"])),
        timezone=row["timezone"],
        catch_up=CatchUp(row["catch_up"]),
        jitter_ms=row["jitter_ms"],
        ttl_ms=row["ttl_ms"],
    )
    return Schedule(
        spec=spec,
        create_time=row["create_time"],
        update_time=row["update_time"],
        created_by=row["created_by"],
        paused=bool(row["paused"]),
        next_tick=row["next_tick"],
        next_fire_time=row["next_fire_time"],
        last_tick=row["last_tick"],
        last_run_id=row["last_run_id"],
        skipped=row["skipped"],
    )


class ScheduleTx:
    """The schedules' statements inside the writer's transaction (a mixin of `_WriteTx`)."""

    _conn: Connection
    row_locks: bool

    def due_schedules(self, now: int, limit: int) -> list[Schedule]:
        """Up to `limit` active schedules due at `now`, soonest first, locked; rows another
        transaction holds are skipped (its replica is firing them)."""
        rows = self._conn.execute(_SELECT_DUE_LOCKED, {"now": now, "limit": limit}).mappings()
        return [to_schedule(row) for row in rows]

    def get_schedule(self, name: str) -> Schedule | None:
        """The schedule, locked for this transaction."""
        row = self._conn.execute(_by_name.with_for_update(), {"name": name}).mappings().first()
        return None if row is None else to_schedule(row)

    def insert_schedule(self, schedule: Schedule) -> None:
        self._conn.execute(insert(schedules), [to_row(schedule)])

    def update_schedules(self, items: Sequence[Schedule]) -> None:
        if not items:
            return
        columns = [c.name for c in schedules.c if c.name != "name"]
        stmt = _update.values({name: bindparam(f"b_{name}") for name in columns})
        rows = [{f"b_{k}": v for k, v in to_row(s).items()} for s in items]
        self._conn.execute(stmt, rows)

    def delete_schedule(self, name: str) -> bool:
        result = self._conn.execute(delete(schedules).where(_s.name == name))
        return bool(result.rowcount)


class ScheduleReads:
    """The schedules as the API reads them (a mixin of the store)."""

    def _read(self, read: Callable[[Connection], T]) -> T:
        raise NotImplementedError  # the store's

    def read_schedule(self, name: str) -> Schedule | None:
        row = self._read(lambda conn: conn.execute(_by_name, {"name": name}).mappings().first())
        return None if row is None else to_schedule(row)

    def soonest_fire_time(self) -> int | None:
        """When the next active schedule fires (None: none is active), read without a
        transaction of the writer, so that an idle scheduler costs the writer nothing."""
        value = self._read(lambda conn: conn.execute(soonest).scalar())
        return None if value is None else int(value)

    def list_schedules(self, after: str, limit: int) -> list[Schedule]:
        """Up to `limit` schedules whose name sorts after `after`, by name."""
        params = {"after": after, "limit": limit}
        rows = self._read(lambda conn: conn.execute(_page, params).mappings().all())
        return [to_schedule(row) for row in rows]
