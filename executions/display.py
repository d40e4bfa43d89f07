"""Human-readable one-liners for events, results and executions (CLI, demo, admin)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from executions.events import (
    Created,
    Err,
    Event,
    ExecutionFailure,
    Finished,
    HistoryEventRecord,
    Locked,
    Ok,
    RetVal,
    TemporarilyFailed,
    TemporarilyTimedOut,
    Unlocked,
)


def short_json(value, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_retval(retval: RetVal) -> str:
    if isinstance(retval, Ok):
        return f"ok {short_json(retval.value)}"
    if isinstance(retval, Err):
        return f"error value {short_json(retval.value)}"
    if isinstance(retval, ExecutionFailure):
        reason = f": {retval.reason}" if retval.reason else ""
        return f"failed ({retval.kind}){reason}"
    return str(retval)


def _time(at: datetime) -> str:
    return at.strftime("%H:%M:%S.%f")[:-3]


def describe_event(event: Event) -> str:
    if isinstance(event, Created):
        return f"created  {event.ffqn}({', '.join(short_json(p, 40) for p in event.params)})"
    if isinstance(event, Locked):
        return f"locked   by {event.run_id} (generation {event.lock_generation}) until {_time(event.lock_expires_at)}"
    if isinstance(event, TemporarilyFailed):
        return f"failed   {event.reason}; retry at {_time(event.backoff_expires_at)}"
    if isinstance(event, TemporarilyTimedOut):
        return f"timed out; retry at {_time(event.backoff_expires_at)}"
    if isinstance(event, Unlocked):
        return f"unlocked ({event.reason}) at {_time(event.unlocked_at)}"
    if isinstance(event, Finished):
        return f"finished {describe_retval(event.retval)}"
    if isinstance(event, HistoryEventRecord):
        return f"history  {describe_history(event.event)}"
    return event.VARIANT.replace("_", " ")


def describe_history(history) -> str:
    """A workflow's ``HistoryEvent`` as one line: what the workflow did."""
    kind = history.type
    if kind == "join_set_create":
        return f"join_set_create {history.join_set_id}"
    if kind == "join_set_request":
        request = history.request
        if request.type == "child_execution_request":
            params = ", ".join(short_json(p, 30) for p in request.params)
            return (
                f"child_execution_request in {history.join_set_id}: {request.child_execution_id} "
                f"{request.target_ffqn}({params})"
            )
        return f"delay_request in {history.join_set_id}: {request.delay_id} until {_time(request.expires_at)}"
    if kind == "join_next":
        return f"join_next {history.join_set_id} (wait for its next response)"
    if kind == "join_next_try":
        return f"join_next_try {history.join_set_id}: {history.outcome}"
    if kind == "schedule":
        return f"schedule {history.execution_id} {history.target_ffqn or ''}".rstrip()
    if kind == "stub":
        return f"stub {history.target_execution_id}"
    if kind == "persist":
        return f"persist {persisted_text(history)}"
    return f"{kind} {short_json(history.model_dump(mode='json', exclude={'type'}), 60)}"


def persisted_text(persist) -> str:
    """A ``Persist`` event's value as the workflow saw it: ``ctx.now()`` as a UTC time, a
    random number as a number, a random string as text (the bytes are their encodings:
    ISO text, 8 bytes big-endian, UTF-8)."""
    raw = bytes(persist.value)
    kind = persist.kind.get("type")
    try:
        if kind == "now":
            return f"now = {exact_time(datetime.fromisoformat(raw.decode()))} UTC"
        if kind == "random_u64":
            return f"random number = {int.from_bytes(raw, 'big')}"
        if kind == "random_string":
            return f"random string = {short_json(raw.decode(), 60)}"
    except ValueError:
        pass
    return f"{short_json(persist.kind, 40)} = {raw.hex()}"


def format_history(log) -> list[str]:
    """``store.ExecutionLog`` → lines: one per event, then one per response."""
    lines = [
        f"  v{record.version:<3} {_time(record.created_at)}  {describe_event(record.event)}" for record in log.events
    ]
    for response in log.responses:
        what = response.child_execution_id or response.delay_id
        lines.append(f"  resp #{response.seq} {response.join_set_id} {what}")
    return lines


def format_logs(entries) -> list[str]:
    """``store.LogRecord``s → lines: time, run, level (upper case) or stream, text."""
    lines = []
    for entry in entries:
        if entry.level is not None:
            what, text = entry.level.upper(), entry.message
        else:
            what, text = entry.stream or "stream", (entry.payload or b"").decode("utf-8", "replace")
        for i, part in enumerate(text.rstrip("\n").splitlines() or [""]):
            prefix = f"  {_time(entry.created_at)}  {entry.run_id}  {what:<6}" if i == 0 else " " * 50
            lines.append(f"{prefix} {part}")
    return lines


# ---------------------------------------------------------------------------------------
# The operator console: exact times, durations, outcome badges, short reasons.
# ---------------------------------------------------------------------------------------

# Colours of the outcome badges (``executions.outcome`` words): background, text.
OUTCOME_COLOURS: dict[str, tuple[str, str]] = {
    "ok": ("#2e7d32", "#fff"),
    "error": ("#ef6c00", "#fff"),
    "timed_out": ("#c62828", "#fff"),
    "cancelled": ("#c62828", "#fff"),
    "uncategorized": ("#c62828", "#fff"),
    "nondeterminism_detected": ("#c62828", "#fff"),
    "out_of_fuel": ("#c62828", "#fff"),
    "running": ("#1565c0", "#fff"),
    "pending": ("#757575", "#fff"),
    "scheduled": ("#9e9e9e", "#fff"),
    "blocked": ("#6a1b9a", "#fff"),
    "paused": ("#f9a825", "#222"),
    "cancelling": ("#bf360c", "#fff"),
}


def exact_time(at: datetime | None) -> str:
    """``2030-01-01 12:00:00.123`` in UTC, to the millisecond; ``—`` for none."""
    if at is None:
        return "—"
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def format_duration(delta) -> str:
    """A ``timedelta`` (or seconds) as an operator reads it: ``850 ms``, ``4.21 s``,
    ``3 min 02 s``, ``2 h 05 min``, ``3 d 4 h``; ``—`` for none."""
    if delta is None:
        return "—"
    seconds = delta if isinstance(delta, (int, float)) else delta.total_seconds()
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 1:
        return f"{sign}{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{sign}{seconds:.2f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours} h {minutes:02d} min"
    days, hours = divmod(hours, 24)
    return f"{sign}{days} d {hours} h"


def outcome_badge(outcome: str):
    """An HTML badge for an ``executions.outcome`` word (safe markup)."""
    from django.utils.html import format_html

    background, colour = OUTCOME_COLOURS.get(outcome, ("#555", "#fff"))
    return format_html(
        '<span class="obelisk-badge obelisk-{}" style="background:{};color:{}">{}</span>',
        outcome,
        background,
        colour,
        outcome.replace("_", " "),
    )


def short_reason(retval: RetVal | None, limit: int = 90) -> str:
    """Why it ended, short: an error value's JSON, a failure's kind-less reason; ``""`` for
    ok or none."""
    if isinstance(retval, Err):
        return short_json(retval.value, limit)
    if isinstance(retval, ExecutionFailure):
        text = (retval.reason or retval.kind.replace("_", " ")).strip().splitlines()
        first = text[0] if text else retval.kind
        return first if len(first) <= limit else first[: limit - 1] + "…"
    return ""


def pretty_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)


def event_title(event: Event) -> str:
    """What an event is, for the console's timeline: a workflow's history events are
    named by what the workflow did (a child or delay requested, a wait, ``ctx.now()``),
    not all "History" (D91)."""
    if isinstance(event, HistoryEventRecord):
        history = event.event
        if history.type == "join_set_request":
            return HISTORY_TITLES[history.request.type]
        if history.type == "persist":
            return PERSIST_TITLES.get(history.kind.get("type"), "Value recorded")
        return HISTORY_TITLES.get(history.type, history.type.replace("_", " "))
    return EVENT_TITLES.get(event.VARIANT, event.VARIANT)


HISTORY_TITLES = {
    "join_set_create": "Join set opened",
    "child_execution_request": "Child started",
    "delay_request": "Delay started",
    "join_next": "Waiting for a response",
    "join_next_try": "Checked for a response",
    "join_next_too_many": "Waited once too often",
    "schedule": "Execution scheduled",
    "stub": "Child stubbed",
}
PERSIST_TITLES = {
    "now": "Time read (ctx.now)",
    "random_u64": "Random number drawn",
    "random_string": "Random string drawn",
}

EVENT_TITLES = {
    "created": "Created",
    "locked": "Locked (run started)",
    "unlocked": "Unlocked",
    "component_upgrade_finished": "Component upgraded",
    "temporarily_failed": "Attempt failed",
    "temporarily_timed_out": "Attempt timed out",
    "finished": "Finished",
    "history_event": "History",
    "paused": "Paused",
    "unpaused": "Resumed",
    "cancellation_requested": "Cancellation requested",
}
