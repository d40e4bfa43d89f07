"""The execution page's history: one timeline row per event, oldest first.

Each row has its version (a link to the execution as of that event), its exact time, the
time since the previous event, a title naming what the event did (a workflow's history
events by what the workflow did: *Child started*, *Waiting for a response*, …), a one-line
description, and a failure's traceback when it has one.

Above it, a button downloads the whole history as one JSON document (``export_link``), to
keep as a test fixture and replay against new code (``workers.testing.replay``).

why: D90 (links with ids as they are), D91 (events named by what they did), D123 (the export)
"""

from __future__ import annotations

from executions import display
from executions.console.urls import execution_url, export_url
from executions.events import ExecutionFailure, Finished, TemporarilyFailed
from executions.store.export import export_filename


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


def export_link(execution_id: str) -> dict | None:
    """The download button's address and file name; None where the API is not mounted."""
    url = export_url(execution_id)
    return {"url": url, "filename": export_filename(execution_id)} if url else None


def _failure_of(event) -> str | None:
    """The traceback a failed attempt or a final failure carries."""
    if isinstance(event, TemporarilyFailed) and event.detail:
        return event.detail
    if isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
        return event.retval.detail
    return None
