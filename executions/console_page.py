"""The console's execution page, built from what the store and the client read: outcome,
result or failure with its traceback, timings, the children (with durations), the history
as a timeline whose versions time-travel (``?as_of=<version>``, ``executions.timetravel``),
responses, logs, backtraces and the audit trail.

Split from ``executions.admin`` so each part of the page is one short function; the admin
adds the actions a user may take and renders ``change_form.html``. Ids in the page's links
are written as they are, not in the admin's ``_5F`` escaping, so they can be copied (D90).
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

from django.contrib import messages
from django.urls import reverse
from django.utils import timezone

from executions import client, display, store, timetravel
from executions.events import ExecutionFailure, Finished, Locked, TemporarilyFailed, TemporarilyTimedOut
from executions.outcome import outcome_of_retval

MAX_LOGS = 2000
CHANGE_URL = "admin:obelisk_executions_executionstate_change"


def execution_url(execution_id: str, **query) -> str:
    """The execution's page; the id in the path as it is, so the address can be copied and
    pasted into ``obelisk_status`` (D90)."""
    url = reverse(CHANGE_URL, args=[execution_id])
    if query:
        url += "?" + "&".join(f"{key}={value}" for key, value in query.items())
    return url


def build(request, execution_id: str) -> dict:
    """The page's context (without the admin's own context and the actions)."""
    now = timezone.now()
    log = store.get(execution_id)
    detail = client.get(execution_id)
    state = log.state
    execution_id = state.execution_id
    as_of = _as_of(request, log)
    events = as_of.events if as_of else log.events
    retval = _retval(detail, as_of, events)
    outcome = as_of.status if as_of else state.outcome(now)
    traceback_text, traceback_source = _traceback(retval, events)
    context = {
        "execution_id": execution_id,
        "state": state,
        "detail": detail,
        "outcome": outcome,
        "is_finished": as_of is None and state.is_finished,
        "outcome_badge": display.outcome_badge(outcome),
        "reason": display.short_reason(retval, 300) if retval is not None else "",
        "arguments": display.pretty_json(detail.params),
        "metadata": detail.metadata,
        "result_json": _result_json(retval),
        "retval": retval,
        "traceback_text": traceback_text,
        "traceback_source": traceback_source,
        "timings": _timings(state, detail, as_of, events, retval, now),
        "timeline": _timeline(execution_id, events, as_of),
        "hidden_events": len(log.events) - len(events),
        "responses": _responses(as_of.responses if as_of else log.responses),
        "tree": _tree(execution_id, now) if as_of is None else [],
        "requests": _requests(as_of) if as_of is not None else [],
        "as_of": as_of,
        "as_of_at": display.exact_time(as_of.at) if as_of else None,
        "present_url": execution_url(execution_id),
        "parent_url": execution_url(detail.parent_id) if detail.parent_id else None,
        "internal": [(name, getattr(state, name)) for name in store.ExecutionSnapshot.__dataclass_fields__],
        "deployment_url": reverse("admin:obelisk_deployments_deployment_change", args=[state.deployment_id]),
        "list_url": reverse("admin:obelisk_executions_executionstate_changelist"),
    }
    context.update(_links(execution_id, detail))
    context.update(_logs_and_backtraces(execution_id, as_of))
    return context


def _as_of(request, log) -> timetravel.AsOf | None:
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


def _retval(detail, as_of, events):
    """The result as of then: the present's, or the last ``Finished`` shown."""
    if as_of is None:
        return detail.retval
    finished = [r for r in events if isinstance(r.event, Finished)]
    return finished[-1].event.retval if finished else None


def _result_json(retval) -> str | None:
    if retval is None or isinstance(retval, ExecutionFailure):
        return None
    return display.pretty_json(retval.value)


def _traceback(retval, events) -> tuple[str | None, str | None]:
    """The final failure's traceback, else the last failed attempt's (if no timeout came
    after it)."""
    if isinstance(retval, ExecutionFailure) and retval.detail:
        return retval.detail, "the final failure"
    for record in reversed(events):
        if isinstance(record.event, TemporarilyFailed) and record.event.detail:
            return record.event.detail, f"the last failed attempt (version {record.version}): {record.event.reason}"
        if isinstance(record.event, TemporarilyTimedOut):
            break
    return None, None


def _timeline(execution_id: str, events, as_of) -> list[dict]:
    """One row per event, each labelled by its kind (a workflow's by what it did, D91)."""
    rows = []
    previous = None
    for record in events:
        event = record.event
        failure = None
        if isinstance(event, TemporarilyFailed) and event.detail:
            failure = event.detail
        elif isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
            failure = event.retval.detail
        rows.append(
            {
                "version": record.version,
                "at": display.exact_time(record.created_at),
                "since": display.format_duration(record.created_at - previous) if previous else "",
                "title": display.event_title(event),
                "variant": event.VARIANT,
                "text": display.describe_event(event),
                "detail": failure,
                "url": execution_url(execution_id, as_of=record.version),
                "current": as_of is not None and record.version == as_of.version,
            }
        )
        previous = record.created_at
    return rows


def _timings(state, detail, as_of, events, retval, now) -> list[tuple[str, str]]:
    locks = [r.created_at for r in events if isinstance(r.event, Locked)]
    end = as_of.at if as_of is not None else detail.finished_at
    ended = retval is not None
    reference = end if end is not None else now
    first_lock = locks[0] if locks else None
    so_far = "" if ended else " so far"
    queued = (
        display.format_duration(max(first_lock - detail.scheduled_at, timedelta(0))) if first_lock else "not started"
    )
    return [
        ("created", display.exact_time(state.created_at)),
        ("scheduled at", display.exact_time(detail.scheduled_at)),
        ("first run started", display.exact_time(first_lock)),
        ("finished", display.exact_time(detail.finished_at) if ended else "—"),
        ("queued", queued),
        ("running", (display.format_duration(reference - first_lock) + so_far) if first_lock else "—"),
        ("total", display.format_duration(reference - state.created_at) + so_far),
        ("attempts", str(len(locks))),
        ("failed attempts", str(sum(isinstance(r.event, (TemporarilyFailed, TemporarilyTimedOut)) for r in events))),
    ]


def child_duration(child, now) -> str:
    """How long a child took, or has taken so far."""
    if child.is_finished:
        return display.format_duration(child.pending_expires_finished - child.created_at)
    return display.format_duration(now - child.created_at) + " so far"


def _tree(execution_id: str, now) -> list[dict]:
    """The children, depth-first, each with its outcome, reason and duration."""
    tree = []
    for child, child_retval in store.get_tree(execution_id)[1:]:
        depth = child.execution_id.count(".") - execution_id.count(".")
        outcome = child.outcome(now)
        tree.append(
            {
                "id": child.execution_id,
                "short": child.execution_id[len(execution_id) + 1 :],
                "url": execution_url(child.execution_id),
                "ffqn": child.ffqn,
                "outcome": outcome,
                "badge": display.outcome_badge(outcome),
                "reason": display.short_reason(child_retval, 80),
                "duration": child_duration(child, now),
                "indent": (depth - 1) * 1.5,
            }
        )
    return tree


def _requests(as_of: timetravel.AsOf) -> list[dict]:
    """The children and delays requested by then, each as it stood then."""
    rows = []
    for request in as_of.requests:
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
        rows.append(
            {
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
        )
    return rows


def _responses(responses) -> list[dict]:
    rows = []
    for r in responses:
        if r.child_retval is not None:
            result = display.describe_retval(r.child_retval)
        else:
            result = "delay fired" if r.delay_success else "delay cancelled" if r.delay_id else ""
        rows.append(
            {
                "seq": r.seq,
                "at": display.exact_time(r.created_at),
                "join_set_id": r.join_set_id,
                "what": r.child_execution_id or r.delay_id,
                "url": execution_url(r.child_execution_id) if r.child_execution_id else None,
                "result": result,
            }
        )
    return rows


def _links(execution_id: str, detail) -> dict:
    """Retries both ways, and the audit trail they are read from."""
    audit = client.audit_trail(execution_id)
    retried_as = [
        entry.detail["new_execution_id"]
        for entry in audit
        if entry.action == "retry" and entry.detail.get("new_execution_id")
    ]
    retry_of = detail.metadata.get("retry_of")
    return {
        "retry_of": retry_of,
        "retry_of_url": execution_url(retry_of) if retry_of else None,
        "retried_as": [(new_id, execution_url(new_id)) for new_id in retried_as],
        "audit": [
            {
                "at": display.exact_time(entry.created_at),
                "actor": entry.actor,
                "via": entry.via,
                "action": entry.action,
                "detail": display.short_json(entry.detail, 200),
            }
            for entry in audit
        ],
    }


def _logs_and_backtraces(execution_id: str, as_of) -> dict:
    """Logs grouped by run, and the workflow's backtraces; as of then when time-travelling."""
    logs = store.list_logs(execution_id, limit=MAX_LOGS)
    if as_of is not None:
        logs = [entry for entry in logs if entry.created_at <= as_of.at]
    runs: OrderedDict[str, list] = OrderedDict()
    for entry in logs:
        text = entry.message if entry.message is not None else (entry.payload or b"").decode("utf-8", "replace")
        runs.setdefault(entry.run_id, []).append(
            {"at": display.exact_time(entry.created_at), "what": entry.level or entry.stream, "text": text}
        )
    backtraces = [
        {
            "from": low,
            "to": high,
            "frames": "\n".join(f"{f['file']}:{f['line']} in {f['function']}: {f['code']}" for f in frames),
        }
        for low, high, frames in store.list_backtraces(execution_id)
        if as_of is None or low <= as_of.version
    ]
    return {"runs": runs, "backtraces": backtraces}
