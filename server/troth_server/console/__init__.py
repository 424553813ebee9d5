"""`troth console`: a web console that is a client of the troth API.

The approvals inbox (forms from each promise's JSON Schema), a promise's page,
a workflow's timeline, the tasks and workers lists, live through Server-Sent
Events from `WatchPromises`. Pure parts: `_forms` and `_views`; the app:
`_app` (composition and `main`), `_routes`, `_pages` (templates), `_session`
(cookies, CSRF), `_clients` (one SDK `Client` per person), `_live` (SSE).
Its web dependencies come with the `console` extra; `troth_server.cli.console`
imports `_app` only when the command runs.
"""
