"""The Workflows page's filters, from its query string and back: pure.

Each filter is one of `Client.search_workflows`'s; times are read as UTC (the
page says so), from a `datetime-local` input or an ISO 8601 text with a zone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from troth import PromiseState

__all__ = ["PAGE_SIZE", "STATES", "WorkflowFilters", "filters_from"]

PAGE_SIZE = 50
"""Workflows on one page of the list."""

STATES = tuple(state.value for state in PromiseState)
"""The states a person may filter by, as the query string spells them."""


@dataclass(frozen=True, slots=True)
class WorkflowFilters:
    """What the person asked for (texts as typed, for the form to show them again)."""

    id: str = ""
    state: str = ""
    group: str = ""
    workflow: str = ""
    version: str = ""
    paused: bool = False
    human: bool = False
    """Only those waiting for a human decision."""
    after: str = ""
    before: str = ""
    page: int = 0
    errors: tuple[str, ...] = field(default=())
    """What could not be read, in words (nothing is searched then)."""

    def arguments(self) -> dict[str, Any]:
        """`Client.iter_workflows`'s keyword arguments (the page aside)."""
        return {
            "id": self.id or None,
            "states": [self.state] if self.state else None,
            "group": self.group or None,
            "workflow": self.workflow or None,
            "version": self.version or None,
            "paused": self.paused,
            "waiting_for_human": self.human,
            "created_after": _moment(self.after),
            "created_before": _moment(self.before),
        }

    def query(self, page: int) -> str:
        """The query string of page `page` of this same list."""
        pairs: list[tuple[str, str]] = []
        for one in fields(self):
            if one.name in ("page", "errors"):
                continue
            value = getattr(self, one.name)
            if value is True:
                pairs.append((one.name, "1"))
            elif value:
                pairs.append((one.name, str(value)))
        if page:
            pairs.append(("page", str(page)))
        return urlencode(pairs)

    @property
    def any(self) -> bool:
        """Whether any filter is set."""
        return bool(self.query(0))


def _moment(text: str) -> datetime | None:
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def filters_from(query: Mapping[str, str]) -> WorkflowFilters:
    """The filters in `query` (a request's query parameters); what cannot be read is
    named in `errors`."""
    errors: list[str] = []

    def text(name: str) -> str:
        return query.get(name, "").strip()

    state = text("state").upper()
    if state and state not in STATES:
        errors.append(f"state {state!r} is not one of {', '.join(STATES)}")
        state = ""
    moments = {}
    for name in ("after", "before"):
        moments[name] = text(name)
        try:
            _moment(moments[name])
        except ValueError:
            errors.append(
                f"started {name} {moments[name]!r} is not a date and time, e.g. 2026-05-28T09:30"
            )
            moments[name] = ""
    page_text = text("page") or "0"
    page = int(page_text) if page_text.isdigit() else 0
    return WorkflowFilters(
        id=text("id"),
        state=state,
        group=text("group"),
        workflow=text("workflow"),
        version=text("version"),
        paused=text("paused") in ("1", "on", "true"),
        human=text("human") in ("1", "on", "true"),
        after=moments["after"],
        before=moments["before"],
        page=min(page, 10_000),
        errors=tuple(errors),
    )
