"""The execution page's timings: created, scheduled, first run, finished, and how long it
queued, ran and took in all, with its attempts and failed attempts.

Durations of an unfinished execution run to now and say "so far"; as of a version they run
to that event's time. Times are exact to the millisecond (``display.exact_time``).

why: D91 (the page reads as what the execution did)
"""

from __future__ import annotations

from datetime import timedelta

from executions import display
from executions.events import Locked, TemporarilyFailed, TemporarilyTimedOut


def timings(state, detail, as_of, events, retval, now) -> list[tuple[str, str]]:
    """``(label, value)`` rows of the "Timings" table."""
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
