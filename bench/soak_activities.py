"""The soak test's activities (``bench/soak.py``; ``OBELISK_COMPONENT_MODULES=bench.soak_activities``).

Every activity first appends one line to a file under ``starts_dir`` (the directory the
soak driver shares with its worker clusters): execution id, attempt, pid, process group
(= the cluster's main pid), time and run id (which ties the start to its ``Locked`` event). The driver counts these lines against each
execution's history to find runs of the same code that happened more than once. One file
per process, so concurrent writers never interleave; each line is written by one
``write`` and closed at once, so a ``kill -9`` right after the start still leaves it.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

from workers import ActivityError, activity, current_activity

# Every activity but the one meant to time out absorbs the loss of a worker or two.
RETRIES = {"max_retries": 3, "backoff": timedelta(milliseconds=100), "lock_duration": timedelta(seconds=5)}
DELIBERATE = "deliberate failure"


class SoakFailure(Exception):
    """Raised by the soak's failing activities; its name marks a failure by their own code."""


def record_start(starts_dir: str) -> int:
    """Append this run's start line; returns the attempt number."""
    context = current_activity()
    line = (
        f"{context.execution_id} {context.attempt} {os.getpid()} {os.getpgid(0)} {time.time():.6f} {context.run_id}\n"
    )
    with open(Path(starts_dir, f"starts-{os.getpid()}.log"), "a") as out:
        out.write(line)
    return context.attempt


@activity(name="soak:acts/quick.noop", **RETRIES)
def noop(starts_dir: str) -> None:
    record_start(starts_dir)


@activity(name="soak:acts/slow.sleep", timeout=timedelta(seconds=30), **RETRIES)
def slow(starts_dir: str, seconds: float) -> float:
    """A slow step (1-3 s): longer than HAND_BACK_AFTER, shorter than the shutdown grace."""
    record_start(starts_dir)
    time.sleep(seconds)
    return seconds


@activity(name="soak:acts/slow.long", timeout=timedelta(seconds=30), **RETRIES)
def long(starts_dir: str, seconds: float) -> float:
    """Longer than the shutdown grace (5 s; runs 8-10 s): a stopping worker must interrupt it and hand
    it back, so it runs again elsewhere."""
    record_start(starts_dir)
    time.sleep(seconds)
    return seconds


@activity(name="soak:acts/flaky.fail-first", max_retries=5, backoff=timedelta(milliseconds=100),
          lock_duration=timedelta(seconds=5))  # fmt: skip
def flaky(starts_dir: str, failures: int) -> int:
    """Fails its first ``failures`` attempts, then succeeds (returns the attempt)."""
    attempt = record_start(starts_dir)
    if attempt <= failures:
        raise SoakFailure(f"attempt {attempt} of {failures} planned failures")
    return attempt


@activity(name="soak:acts/failing.always", **RETRIES)
def always_fails(starts_dir: str, as_error_value: bool) -> None:
    """Never succeeds: an error value (``err``) or an exception (``uncategorized``)."""
    record_start(starts_dir)
    if as_error_value:
        raise ActivityError({"soak": DELIBERATE})
    raise SoakFailure(DELIBERATE)


@activity(name="soak:acts/overrun.sleep", max_retries=0, timeout=timedelta(seconds=1),
          lock_duration=timedelta(seconds=5))  # fmt: skip
def overrun(starts_dir: str, seconds: float) -> float:
    """Sleeps past its 1 s timeout: its own watchdog must finish it as timed out."""
    record_start(starts_dir)
    time.sleep(seconds)
    return seconds


@activity(name="soak:acts/cancel.target", timeout=timedelta(seconds=60), **RETRIES)
def cancel_target(starts_dir: str, seconds: float) -> float:
    """Runs long enough for the driver to see it start and cancel it."""
    record_start(starts_dir)
    time.sleep(seconds)
    return seconds
