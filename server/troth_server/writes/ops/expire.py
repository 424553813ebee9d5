"""Promises past their expire_time: the sweeper's batch of timeouts (`ExpireOp`), and
the promises a reader found due (`ReadDueOp`), settled at the transaction's time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from troth_server.writes.batch import Batch, Keys

if TYPE_CHECKING:
    from troth_server.domain.promise import Promise
    from troth_server.store import WriteTx


@dataclass(frozen=True, slots=True)
class ExpireOp:
    now: int | None
    """None: the transaction's time (the store's clock), as in production."""
    limit: int
    ids: list[str] = field(default_factory=list)
    """Chosen (and locked) inside the transaction, each time it runs."""

    def keys(self, tx: WriteTx, now: int) -> Keys:
        # Another replica's sweep holds the rows it is expiring: skipped, not waited for.
        at = now if self.now is None else self.now
        self.ids[:] = tx.expired_promise_ids(at, self.limit)
        return Keys(promises=self.ids, steps_of=self.ids)

    def apply(self, batch: Batch) -> int:
        # Re-checked on the batch's view: a settle of the same batch may have won.
        at = batch.now if self.now is None else self.now
        return sum(batch.expire_if_due(promise_id, at) for promise_id in self.ids)


@dataclass(frozen=True, slots=True)
class ReadDueOp:
    """Promises a reader found past their expire_time: as the writer decides them."""

    ids: tuple[str, ...]

    def keys(self, tx: WriteTx, now: int) -> Keys:
        return Keys(promises=self.ids)

    def apply(self, batch: Batch) -> list[Promise]:
        # `get` settles a promise due at the batch's time; one settled first stays so.
        return [p for p in map(batch.get, self.ids) if p is not None]
