"""The execution page's history: one timeline row per event, oldest first.

Each row has its version (a link to the execution as of that event), its exact time, the
time since the previous event, a title naming what the event did (a workflow's history
events by what the workflow did: *Child started*, *Waiting for a response*, …), a one-line
description, and a failure's traceback when it has one.

why: D90 (links with ids as they are), D91 (events named by what they did)
"""

from __future__ import annotations

from executions import display
from executions.console.urls import execution_url
from executions.events import ExecutionFailure, Finished, TemporarilyFailed


def timeline(execution_id: str, events, as_of) -> list[dict]:
    """One row per event, each labelled by its kind (a workflow's by what it did, D91)."""
    rows = []
    previous = None
    for record in events:
        event = record.event
        rows.append(
            {
                "version": record.version,
                "at": display.exact_time(record.created_at),
                "since": display.format_duration(record.created_at - previous) if previous else "",
                "title": display.event_title(event),
                "variant": event.VARIANT,
                "text": display.describe_event(event),
                "detail": _failure_of(event),
                "url": execution_url(execution_id, as_of=record.version),
                "current": as_of is not None and record.version == as_of.version,
            }
        )
        previous = record.created_at
    return rows


def _failure_of(event) -> str | None:
    """The traceback a failed attempt or a final failure carries."""
    if isinstance(event, TemporarilyFailed) and event.detail:
        return event.detail
    if isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
        return event.retval.detail
    return None
