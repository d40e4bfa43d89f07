"""The execution page as of a version (``?as_of=<version>``): which version was asked for,
and what the execution had requested by then.

The state as of then is ``executions.timetravel.as_of`` (pure); this module reads the
version from the request (a version with no event says so and shows the present; the
newest version is the present) and lists the children and delays requested by then, each
as it stood then: a child with the response that had arrived, a delay fired or waiting.

why: D90 (links with ids as they are), D91 (a workflow's page)
"""

from __future__ import annotations

from django.contrib import messages

from executions import display, timetravel
from executions.console.urls import execution_url
from executions.outcome import outcome_of_retval


def as_of_asked(request, log) -> timetravel.AsOf | None:
    """``?as_of=<version>``: the execution as of that event; ``None`` for the present."""
    raw = request.GET.get("as_of")
    if raw in (None, ""):
        return None
    try:
        as_of = timetravel.as_of(log.events, log.responses, int(raw))
    except ValueError:
        messages.warning(request, f"No event at version {raw[:20]}; showing the present.")
        return None
    return None if as_of.is_last else as_of


def requested_by_then(as_of: timetravel.AsOf) -> list[dict]:
    """The children and delays requested by then, each as it stood then."""
    return [_request_row(request) for request in as_of.requests]


def _request_row(request: timetravel.RequestAsOf) -> dict:
    response = request.response
    if request.kind == "child":
        if response is not None and response.child_retval is not None:
            outcome = outcome_of_retval(response.child_retval)
            reason = display.short_reason(response.child_retval, 80)
        else:
            outcome, reason = "running", "no response yet"
        url = execution_url(request.id)
    else:
        outcome = "ok" if response is not None else "scheduled"
        reason = "fired" if response is not None else "waiting"
        url = None
    return {
        "id": request.id,
        "kind": request.kind,
        "ffqn": request.ffqn or "delay",
        "join_set_id": request.join_set_id,
        "version": request.requested_version,
        "outcome": outcome,
        "badge": display.outcome_badge(outcome),
        "reason": reason,
        "url": url,
    }
