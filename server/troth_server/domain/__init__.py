"""Pure state machines of troth: no I/O, no clock (`now` is always a parameter)."""

from __future__ import annotations
