"""claims by route: the workflows and versions a stream runs, in the claim's indexes

Revision ID: 0014
Revises: 0013
Create Date: 2027-03-12

A stream that lists its workflows takes only some of its group's tasks (its
route: the (workflow, version) pairs it runs, the unversioned starts of the
workflows whose newest version it runs, and those of workflows no stream lists).
The claim's probes of 0013 read a group's ready tasks by age and filtered them by
the route: a claim walked past every older task it could not take, e.g. a backlog
of a version whose workers are gone (100,000 rows per claim in `make
bench-scale`). These indexes put the route in the key, version first, so that
each thing a route takes is one prefix (or, for workflows no stream lists, a
range of the unversioned prefix) read in the probe's order. On PostgreSQL the
nullable columns are keyed as `coalesce(column, '')`: an equality, which its
planner takes as an order the index keeps (`IS NULL` it does not: it sorted the
key); SQLite takes `IS NULL` as one, and keys the columns:

- `ix_tasks_route_ready`: ready tasks by group, version, workflow, preferred
  worker and age (a worker's own resumes, and those preferred for nobody);
- `ix_tasks_route_promised`: ready tasks preferred for some worker, by group,
  version, workflow and age;
- `ix_tasks_route_backoff`: tasks waiting out a retry backoff, by group,
  version, workflow and the time they may run again.

A stream that lists nothing (it takes any task) keeps 0013's indexes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_READY = "state = 'PENDING' AND next_attempt_time IS NULL"
_INDEXES = {
    # name: (nullable key columns, the rest, its rows)
    "ix_tasks_route_ready": (
        ["workflow_version", "workflow", "preferred_worker_id"],
        ["create_time"],
        _READY,
    ),
    "ix_tasks_route_promised": (
        ["workflow_version", "workflow"],
        ["create_time"],
        f"{_READY} AND preferred_worker_id IS NOT NULL",
    ),
    "ix_tasks_route_backoff": (
        ["workflow_version", "workflow"],
        ["next_attempt_time"],
        "state = 'PENDING' AND next_attempt_time IS NOT NULL",
    ),
}


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    for name, (keyed, rest, where) in _INDEXES.items():
        keys = [f"coalesce({k}, '')" if postgresql else k for k in keyed]
        op.create_index(
            name,
            "tasks",
            [sa.text(column) for column in ['"group"', *keys, *rest]],
            sqlite_where=sa.text(where),
            postgresql_where=sa.text(where),
        )


def downgrade() -> None:
    for name in reversed(list(_INDEXES)):
        op.drop_index(name, "tasks")
