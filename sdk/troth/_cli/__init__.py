"""The `troth` command: operate on promises and workflows from a shell, and start the server.

```
troth [--server ADDR] [--json] [--principal P] [--timeout DURATION] promises get ID
      [--tls] [--tls-ca FILE] [--tls-cert FILE --tls-key FILE] [--tls-server-name NAME]
      [--token-file FILE]
troth promises get|search|create|resolve|reject|cancel|watch|prune ...   (promises)
troth export|replay ...  (recorded workflow histories; replay)
troth tasks list --group G [--limit N]   (tasks)
troth workflows list|start|show|cancel|retry-now|fail|move ...   (workflows)
troth workers list [--group G]   (connected workers; workers)
troth worker MODULE[:ATTR] [--group G] [--path DIR] [--log-level L]   (run one; worker)
troth --version
troth approvals list|approve|reject|watch ...   (the inbox; approvals)
troth serve ...          (forwarded to troth_server.cli.serve; needs troth-server)
troth db upgrade|current [--db URL]   (forwarded to troth_server.cli.db; needs troth-server)
troth tokens new --name N --roles R [--groups G] [--prefixes P]   (troth_server.cli.tokens)
troth console [--listen HOST:PORT] [--server ADDR] ...   (troth_server.cli.console)
```

Exit codes: 0 success, 1 the server refused or could not be reached (the
message is on stderr, no traceback), 2 bad command line, 130 interrupted.

The package is the command line's own wing: `_main` (the entry point) adds one
command group's module (promises, approvals, workflows, tasks, workers, worker,
replay, server), each built on `args` (shared flags, value types, the client)
and `output` (JSON lines, blocks, tables); groups never import each other, and
nothing else in troth imports this package (both checked by import-linter).
"""

from __future__ import annotations

from troth._cli._main import build_parser, main

__all__ = ["build_parser", "main"]
