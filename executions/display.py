"""Human-readable one-liners for events, results and executions (CLI, demo, admin)."""

from __future__ import annotations

import json
from datetime import datetime

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
        return f"history  {event.event.type} {short_json(event.event.model_dump(mode='json', exclude={'type'}), 60)}"
    return event.VARIANT.replace("_", " ")


def format_history(log) -> list[str]:
    """``store.ExecutionLog`` → lines: one per event, then one per response."""
    lines = [
        f"  v{record.version:<3} {_time(record.created_at)}  {describe_event(record.event)}" for record in log.events
    ]
    for response in log.responses:
        what = response.child_execution_id or response.delay_id
        lines.append(f"  resp #{response.seq} {response.join_set_id} {what}")
    return lines


def format_tree(execution_id: str) -> list[str]:
    """An execution and its children, indented by depth: function, outcome, duration."""
    from executions import store

    lines = []
    for state, retval in store.get_tree(execution_id):
        depth = state.execution_id.count(".")
        if retval is None:
            outcome, took = state.status, ""
        else:
            outcome = describe_retval(retval)
            took = f"{(state.pending_expires_finished - state.created_at).total_seconds() * 1000:8.1f} ms  "
        lines.append(f"{'  ' * (depth + 1)}{took}{state.execution_id.rsplit('.', 1)[-1]}  {state.ffqn}  {outcome}")
    return lines


LOG_LEVELS = {1: "TRACE", 2: "DEBUG", 3: "INFO", 4: "WARN", 5: "ERROR"}
STREAMS = {1: "stdout", 2: "stderr"}


def format_logs(entries) -> list[str]:
    """``t_log`` rows → lines: time, run, level or stream, text."""
    lines = []
    for entry in entries:
        if entry.level is not None:
            what, text = LOG_LEVELS.get(entry.level, str(entry.level)), entry.message
        else:
            what, text = STREAMS.get(entry.stream_type, "stream"), bytes(entry.payload).decode("utf-8", "replace")
        for i, part in enumerate(text.rstrip("\n").splitlines() or [""]):
            prefix = f"  {_time(entry.created_at)}  {entry.run_id}  {what:<6}" if i == 0 else " " * 50
            lines.append(f"{prefix} {part}")
    return lines
