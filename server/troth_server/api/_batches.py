"""Several stream messages in one: what `Calls` answers and `Poll` deliveries share.

A message on a stream costs both sides far more than the bytes it carries, so the
messages ready together go as one: the first, with the others in its `more` (a
repeated field of its own type), up to a size; past it, a new message starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Iterable

M = TypeVar("M", bound=Any)
"""A message type with a `more` field of its own type (`CallsResponse`, `PollResponse`)."""


def batched(first: M, ready: Iterable[M | None], limit_bytes: int) -> tuple[list[M], bool]:
    """`first` and the messages of `ready`, each message carrying those after it in
    `more` while it stays under `limit_bytes` (one larger alone goes alone); and
    whether `ready` ended the stream (a None, after which nothing is taken)."""
    messages = [first]
    head, size = first, first.ByteSize()
    for message in ready:
        if message is None:
            return messages, True
        more = message.ByteSize()
        if size + more > limit_bytes:
            messages.append(message)
            head, size = message, more
        else:
            head.more.append(message)
            size += more
    return messages, False
