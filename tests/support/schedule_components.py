"""Activities the schedule tests' worker clusters run (``tests/schedules/``), and one
schedule declared in code.

A cluster serves this module when ``OBELISK_COMPONENT_MODULES`` includes it
(``tests.support.components,tests.support.schedule_components``). The test process does not
import it: the ``@schedule`` below would join the test process's declarations.

``note`` writes one line per run into its marker file: the record of what really ran, so a
test can tell "executed once" from "created once".
"""

from __future__ import annotations

import os
from datetime import timedelta

from workers import activity, current_activity, schedule

NOTE = "test:sched/acts.note"
NIGHTLY = "sched-nightly"  # the schedule declared in code below
NIGHTLY_MARKER = "/nonexistent/obelisk-sched-nightly"  # never written: 03:00 is never reached in a test


@schedule("0 3 * * *", tz="Europe/Prague", id=NIGHTLY, args=[NIGHTLY_MARKER], catchup_window=timedelta(0))
@activity(name=NOTE, max_retries=0, backoff=timedelta(milliseconds=100))
def note(marker: str, scheduled_at: str) -> str:
    """Append ``<execution id> <scheduled_at> <pid>`` to ``marker`` (one whole line in one
    ``write`` on an ``O_APPEND`` file: several worker processes share it)."""
    execution_id = current_activity().execution_id
    with open(marker, "a") as out:
        out.write(f"{execution_id} {scheduled_at} {os.getpid()}\n")
    return scheduled_at
