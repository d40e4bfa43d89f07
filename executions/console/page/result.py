"""The execution page's result: the return value as of the version shown, its JSON, and
the traceback of the final failure or of the last failed attempt.

A return value that is an ``ExecutionFailure`` shows its kind and reason instead of JSON;
its traceback, or else the last failed attempt's (unless a timeout came after it), is the
page's "Traceback" section, with where it came from.

why: D91 (a workflow's page reads as what it did)
"""

from __future__ import annotations

from executions import display
from executions.events import ExecutionFailure, Finished, TemporarilyFailed, TemporarilyTimedOut


def retval_as_of(detail, as_of, events):
    """The result as of then: the present's, or the last ``Finished`` shown."""
    if as_of is None:
        return detail.retval
    finished = [r for r in events if isinstance(r.event, Finished)]
    return finished[-1].event.retval if finished else None


def result_json(retval) -> str | None:
    """The value returned (ok or an error value) as indented JSON; ``None`` for a failure."""
    if retval is None or isinstance(retval, ExecutionFailure):
        return None
    return display.pretty_json(retval.value)


def traceback_of(retval, events) -> tuple[str | None, str | None]:
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
