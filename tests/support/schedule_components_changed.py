"""``test:sched/acts.note`` after a deploy that changed it: a new required parameter, so a
schedule's stored arguments (``[marker]``) no longer fit (``tests/schedules/``). A cluster
serves it instead of ``tests.support.schedule_components``; nothing imports both."""

from __future__ import annotations

from datetime import timedelta

from workers import activity

NOTE = "test:sched/acts.note"


@activity(name=NOTE, max_retries=0, backoff=timedelta(milliseconds=100))
def note(marker: str, scheduled_at: str, copies: int) -> str:
    return scheduled_at * copies
