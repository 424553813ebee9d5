"""How to install what the SDK alone does not bring: the words the CLI and
`troth.testing` both print."""

from __future__ import annotations

INSTALL_SERVER = (
    "pip install ./server from a troth checkout (./server[postgres] for PostgreSQL; "
    "the SDK, troth, is already installed)"
)
"""The command that installs troth-server beside the SDK."""
