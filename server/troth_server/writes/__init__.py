"""The single writer's wing: everything that runs inside the writer's transaction.

- `group_commit`: the `GroupCommitter`, which owns the store's one write path; concurrent
  write requests share one transaction and one commit;
- `batch`: what one batch touches (`Batch`), the `Keys` an op asks loaded, claims in a
  batch and the leases a batch's new tasks get as it commits;
- `ops`: one op per write (a `WriteOp`: `keys`, then `apply` on the batch), built by the
  services and the sweeper and submitted to the committer.

It imports only `troth_server.domain`, `troth_server.store` and `troth_server.clock`
(an import contract in pyproject.toml); the services, the sweeper and the dispatcher
build on it.
"""
