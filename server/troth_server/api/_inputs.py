"""The table of client mistakes: for each RPC and each class of bad input, the answer.

This module owns what the API layer promises about malformed requests (DESIGN
§4 rule 14: a client's mistake is `INVALID_ARGUMENT` naming the field, on both
stores), as data: `ANSWERS` maps every RPC of both services to the classes of
bad input that can reach it and the status and `ErrorInfo.reason` each gets;
`LIST_LIMITS` gives every list (repeated or map) field of every request its
maximum. Tests walk both against a live server on SQLite and PostgreSQL, and
check that docs/configuration.md shows exactly `markdown()` (`python -m
troth_server.api._inputs` prints it).

The checks themselves live in `_checks` (every field of a decoded request,
walked by its descriptor) and `_decode` (bytes that do not decode).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from troth.errors import Reason
from troth_server.domain.approvers import MAX_APPROVERS

if TYPE_CHECKING:
    from troth_server.config import Limits


class BadInput(enum.StrEnum):
    """A class of client mistake, with the words docs/configuration.md uses for it."""

    NUL = "a NUL character (U+0000) in any text field"
    NOT_UTF8 = "a text field whose bytes are not UTF-8 (e.g. a lone surrogate)"
    TRUNCATED = "bytes that are not a whole message (truncated, or garbage)"
    LIST_TOO_LONG = "a list above its maximum"
    BAD_TIMESTAMP = "a Timestamp outside 0001-01-01..9999-12-31 or with nanos outside [0, 10^9)"
    BAD_DURATION = (
        "a Duration beyond ±10,000 years, with nanos outside (-10^9, 10^9) or of the "
        "other sign than its seconds"
    )
    FORGED_PAGE_TOKEN = (
        "a page token this server cannot have issued (edited, or from another search)"
    )
    DEEP_PAGE_TOKEN = "a page token nested deeper than a token can be"


@dataclass(frozen=True, slots=True)
class Answer:
    """What a bad input is answered with: a gRPC status code name and an ErrorInfo reason."""

    code: str
    reason: Reason


INVALID = Answer("INVALID_ARGUMENT", Reason.INVALID_ARGUMENT)
INVALID_TOKEN = Answer("INVALID_ARGUMENT", Reason.INVALID_PAGE_TOKEN)

# Most RPCs meet these: their request has a text field, and every one arrives as bytes.
_EVERY_REQUEST = {BadInput.NUL: INVALID, BadInput.NOT_UTF8: INVALID, BadInput.TRUNCATED: INVALID}

# RPC -> bad input -> answer. Tests check that the classes listed for an RPC are
# exactly those its request has fields for (a list field, a Timestamp, ...).
ANSWERS: dict[str, dict[BadInput, Answer]] = {
    "troth.v1.PromiseService/CreatePromise": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_TIMESTAMP: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.PromiseService/GetPromise": {**_EVERY_REQUEST},
    "troth.v1.PromiseService/SearchPromises": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_TIMESTAMP: INVALID,
        BadInput.FORGED_PAGE_TOKEN: INVALID_TOKEN,
        BadInput.DEEP_PAGE_TOKEN: INVALID_TOKEN,
    },
    "troth.v1.PromiseService/ResolvePromise": {**_EVERY_REQUEST, BadInput.LIST_TOO_LONG: INVALID},
    "troth.v1.PromiseService/RejectPromise": {**_EVERY_REQUEST, BadInput.LIST_TOO_LONG: INVALID},
    "troth.v1.PromiseService/CancelPromise": {**_EVERY_REQUEST, BadInput.LIST_TOO_LONG: INVALID},
    "troth.v1.PromiseService/WatchPromise": {**_EVERY_REQUEST},
    "troth.v1.PromiseService/WaitPromise": {**_EVERY_REQUEST, BadInput.BAD_DURATION: INVALID},
    "troth.v1.PromiseService/WatchPromises": {**_EVERY_REQUEST, BadInput.LIST_TOO_LONG: INVALID},
    # No text field: only bytes that are not a message, and its one Duration.
    "troth.v1.PromiseService/PrunePromises": {
        BadInput.TRUNCATED: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.PromiseService/MintSettleToken": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.TaskService/Poll": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.TaskService/CompleteTask": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        # Its `record_step`: a step's CreatePromise, carried.
        BadInput.BAD_TIMESTAMP: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.TaskService/Heartbeat": {**_EVERY_REQUEST, BadInput.BAD_DURATION: INVALID},
    "troth.v1.TaskService/ReleaseTask": {**_EVERY_REQUEST},
    "troth.v1.TaskService/RegisterCallbacks": {**_EVERY_REQUEST, BadInput.LIST_TOO_LONG: INVALID},
    "troth.v1.TaskService/SearchTasks": {**_EVERY_REQUEST},
    "troth.v1.TaskService/FailTask": {**_EVERY_REQUEST},
    "troth.v1.TaskService/FailWorkflow": {**_EVERY_REQUEST},
    "troth.v1.TaskService/MoveWorkflow": {**_EVERY_REQUEST},
    "troth.v1.TaskService/SearchWorkflows": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_TIMESTAMP: INVALID,
        BadInput.FORGED_PAGE_TOKEN: INVALID_TOKEN,
        BadInput.DEEP_PAGE_TOKEN: INVALID_TOKEN,
    },
    "troth.v1.TaskService/RetryWorkflowNow": {**_EVERY_REQUEST},
    # No field: only bytes that are not the (empty) message.
    "troth.v1.PromiseService/WhoAmI": {BadInput.TRUNCATED: INVALID},
    "troth.v1.TaskService/GetWorkflowState": {**_EVERY_REQUEST},
    "troth.v1.TaskService/ReplaceWorkflowState": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
    },
    "troth.v1.TaskService/SearchWorkers": {
        **_EVERY_REQUEST,
        BadInput.FORGED_PAGE_TOKEN: INVALID_TOKEN,
        BadInput.DEEP_PAGE_TOKEN: INVALID_TOKEN,
    },
    "troth.v1.TaskService/CreateSchedule": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.TaskService/UpdateSchedule": {
        **_EVERY_REQUEST,
        BadInput.LIST_TOO_LONG: INVALID,
        BadInput.BAD_DURATION: INVALID,
    },
    "troth.v1.TaskService/GetSchedule": {**_EVERY_REQUEST},
    "troth.v1.TaskService/SearchSchedules": {
        **_EVERY_REQUEST,
        BadInput.FORGED_PAGE_TOKEN: INVALID_TOKEN,
        BadInput.DEEP_PAGE_TOKEN: INVALID_TOKEN,
    },
    "troth.v1.TaskService/PauseSchedule": {**_EVERY_REQUEST},
    "troth.v1.TaskService/ResumeSchedule": {**_EVERY_REQUEST},
    "troth.v1.TaskService/DeleteSchedule": {**_EVERY_REQUEST},
    # The envelope of a call on the stream; the call inside is checked as its RPC's.
    "troth.v1.TaskService/Calls": {**_EVERY_REQUEST, BadInput.LIST_TOO_LONG: INVALID},
}

MAX_WORKFLOWS = 1000
MAX_CALLS_BATCH = 1000
"""Most calls one `CallsRequest` carries in `more` (the SDK sends at most 64)."""
"""Most (name, version) entries one Poll request may list."""


@dataclass(frozen=True, slots=True)
class ListLimit:
    """The maximum of one list field: a `Limits` attribute (a flag), or a fixed number."""

    limit: str | int
    why: str = ""

    def of(self, limits: Limits) -> int:
        return self.limit if isinstance(self.limit, int) else int(getattr(limits, self.limit))

    @property
    def flag(self) -> str | None:
        return None if isinstance(self.limit, int) else "--" + self.limit.replace("_", "-")

    def describe(self, limits: Limits) -> str:
        """`32 (--max-tags)`, or the fixed number and why."""
        shown = str(self.of(limits))
        return f"{shown} (`{self.flag}`)" if self.flag else f"{shown} ({self.why})"


_TAGS = ListLimit("max_tags")
_CALLBACKS = ListLimit("max_callback_ids")

# (message full name, field name) -> its maximum. Every repeated and map field of
# every request message (nested ones included) has an entry; a test checks it.
LIST_LIMITS: dict[tuple[str, str], ListLimit] = {
    ("troth.v1.Payload", "headers"): ListLimit("max_headers"),
    # Payload.json: each entry of a JSON object or array takes at least one byte of the
    # stored JSON, so the payload limit bounds them (the size is checked once encoded).
    ("google.protobuf.Struct", "fields"): ListLimit("max_payload_bytes"),
    ("google.protobuf.ListValue", "values"): ListLimit("max_payload_bytes"),
    ("troth.v1.CreatePromiseRequest", "tags"): _TAGS,
    ("troth.v1.Approvers", "principals"): ListLimit(MAX_APPROVERS, "approvers of one promise"),
    ("troth.v1.Approvers", "roles"): ListLimit(MAX_APPROVERS, "approver roles of one promise"),
    ("troth.v1.Approvers", "permissions"): ListLimit(
        MAX_APPROVERS, "approver permissions of one promise"
    ),
    ("troth.v1.MintSettleTokenRequest", "outcomes"): ListLimit(2, "resolve and reject"),
    ("troth.v1.SearchPromisesRequest", "tags"): _TAGS,
    ("troth.v1.SearchPromisesRequest", "states"): ListLimit(5, "one entry per promise state"),
    ("troth.v1.WatchPromisesRequest", "tags"): _TAGS,
    ("troth.v1.SearchWorkflowsRequest", "states"): ListLimit(5, "one entry per promise state"),
    ("troth.v1.PollRequest", "workflows"): ListLimit(MAX_WORKFLOWS, "workflow versions"),
    ("troth.v1.CallsRequest", "more"): ListLimit(MAX_CALLS_BATCH, "calls in one Calls message"),
    ("troth.v1.CompleteTaskRequest", "suspend_on"): _CALLBACKS,
    ("troth.v1.RegisterCallbacksRequest", "promise_ids"): _CALLBACKS,
}


def markdown(limits: Limits) -> str:
    """The tables of docs/configuration.md: RPC x bad input, then every list field's maximum."""
    classes = list(BadInput)
    letters = [chr(ord("A") + i) for i in range(len(classes))]
    lines = ["| RPC | " + " | ".join(letters) + " |", "|---" * (len(classes) + 1) + "|"]
    for rpc, answers in ANSWERS.items():
        cells = [_cell(answers.get(c)) for c in classes]
        lines.append(f"| `{rpc.split('/')[1]}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- {letter}: {c.value}" for letter, c in zip(letters, classes, strict=True)]
    lines += ["", "| list field | maximum |", "|---|---|"]
    for (message, field), limit in LIST_LIMITS.items():
        lines.append(
            f"| `{message.removeprefix('troth.v1.')}.{field}` | {limit.describe(limits)} |"
        )
    return "\n".join(lines) + "\n"


def _cell(answer: Answer | None) -> str:
    if answer is None:
        return "—"
    if answer.reason.value == answer.code:
        return f"`{answer.code}`"
    return f"`{answer.code}` `{answer.reason.value}`"


if __name__ == "__main__":  # pragma: no cover - a doc helper
    from troth_server.config import Limits as _Limits

    print(markdown(_Limits()), end="")
