"""One op per write: each a `WriteOp` (`troth_server.writes.group_commit`), which says
what it touches (`keys`, inside the transaction) and what it does to it (`apply`, on the
batch's view). Pure but for the store reads `keys` makes: each can be run on a real store
through `GroupCommitter.submit`, or unit tested on a `Batch`."""
