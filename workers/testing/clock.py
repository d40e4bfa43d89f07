"""Virtual time for ``run_workflow``: one clock the store, the runs and ``ctx.now()`` read.

The clock stands still while something can run and jumps to the next timer (a delay, a
scheduled or retried execution) when nothing can, so a workflow that sleeps a day finishes
in milliseconds and its history records the virtual times. While installed it is what
``django.utils.timezone.now`` returns (the store's and the runtime's clock) and the default
clock of every ``EventHistory`` (``ctx.now()``, a sleep's expiry, a schedule's time); the
engine's own code is not changed. Process-wide for the duration of a ``run_workflow``: a
test's other threads see it too. why: D120
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from django.utils import timezone

from workers.replay.cursor import ReplayCursor

_installing = threading.Lock()


class VirtualClock:
    """A clock that moves only when told (``advance_to``); aware, in UTC."""

    def __init__(self, start: datetime | None = None):
        if start is not None and start.tzinfo is None:
            raise ValueError("run_workflow(now=...) must be timezone-aware, e.g. datetime(2026, 1, 1, tzinfo=UTC)")
        self._now = (start or datetime.now(UTC)).astimezone(UTC)
        self.start = self._now

    def now(self) -> datetime:
        return self._now

    def advance_to(self, at: datetime) -> None:
        """Move forward to ``at``; never backwards (a timer already due leaves it as it is)."""
        if at > self._now:
            self._now = at

    @property
    def elapsed(self):
        return self._now - self.start

    @contextlib.contextmanager
    def installed(self) -> Iterator[VirtualClock]:
        """``timezone.now`` and the replay's default clock read this clock inside."""
        defaults = ReplayCursor.__init__.__kwdefaults__
        with _installing:
            saved_now, saved_clock = timezone.now, defaults["clock"]
            timezone.now = self.now
            defaults["clock"] = self.now
        try:
            yield self
        finally:
            with _installing:
                timezone.now = saved_now
                defaults["clock"] = saved_clock
