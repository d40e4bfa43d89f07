"""Shared output and waiting helpers of the ``obelisk_*`` commands."""

from __future__ import annotations

import sys
import time

from django.core.management.base import CommandError
from django.utils import timezone

from executions import display, errors, store
from executions.models import ExecutionState


def status_line(state: ExecutionState) -> str:
    status = state.status
    if state.state == "pending_at" and state.lifecycle == "active" and state.pending_expires_finished > timezone.now():
        status = f"scheduled for {state.pending_expires_finished:%Y-%m-%d %H:%M:%S}"
    if state.intermittent_event_count:
        status += f", {state.intermittent_event_count} failed attempt(s)"
    return f"{state.execution_id}  {state.ffqn}  {status}"


def result_line(execution_id: str) -> str:
    retval = store.get_finished_result(execution_id)
    return "running" if retval is None else display.describe_retval(retval)


def wait_with_progress(execution_ids: list[str], timeout: float | None, out=sys.stderr) -> None:
    """Wait for the executions to finish, printing their progress every second."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(execution_ids)
    started = time.monotonic()
    while pending:
        step = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        try:
            store.wait_for_finished(pending, timeout=step)
            pending = []
        except errors.Timeout:
            states = ExecutionState.objects.filter(pk__in=pending).exclude(state="finished")
            pending = [s.execution_id for s in states]
            elapsed = time.monotonic() - started
            if pending:
                what = (
                    status_line(states[0])
                    if len(pending) == 1
                    else f"{len(pending)} of {len(execution_ids)} still running"
                )
                if _is_terminal(out):
                    out.write(f"\r  waiting {elapsed:5.1f}s  {what}\033[K")
                else:
                    out.write(f"  waiting {elapsed:5.1f}s  {what}\n")
                out.flush()
            if deadline is not None and time.monotonic() >= deadline and pending:
                raise CommandError(f"timed out with {len(pending)} execution(s) still running") from None
    if time.monotonic() - started >= 1.0 and _is_terminal(out):
        out.write("\n")


def _is_terminal(out) -> bool:
    stream = getattr(out, "_out", out)  # Django's OutputWrapper
    return hasattr(stream, "isatty") and stream.isatty()


def fail(error: errors.StoreError) -> CommandError:
    return CommandError(f"{error.code}: {error}")
