"""Sample activities for the demo (``scripts/demo.sh``)."""

import time
from datetime import timedelta

from workers import activity, current_activity, schedule


@activity(max_retries=3, backoff=timedelta(milliseconds=500))
def greet(name: str) -> str:
    """Succeeds at once."""
    return f"Hello, {name}!"


@activity(max_retries=3, backoff=timedelta(milliseconds=500))
def flaky(failures: int) -> str:
    """Fails ``failures`` times (a transient error), then succeeds: watch the back-off."""
    attempt = current_activity().attempt
    if attempt <= failures:
        raise ConnectionError(f"transient failure on attempt {attempt}")
    return f"succeeded on attempt {attempt}"


@activity(max_retries=1, backoff=timedelta(milliseconds=500), timeout=timedelta(seconds=1))
def slow(seconds: float) -> str:
    """Sleeps longer than its 1 s timeout: stopped, retried once, then finished as timed out."""
    time.sleep(seconds)
    return "woke up"


@schedule(every=timedelta(seconds=10), id="demo-tally", overlap="skip")
@activity(max_retries=3, backoff=timedelta(milliseconds=500))
def tally(scheduled_at: str) -> str:
    """Started by the schedule ``demo-tally`` every 10 s while a worker runs; it receives
    the tick's time (``scheduled_at``)."""
    return f"tick of {scheduled_at}"
