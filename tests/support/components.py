"""Activities used by the worker tests (``OBELISK['COMPONENT_MODULES']`` in test settings)."""

import gc
import logging
import os
import time
from datetime import timedelta
from pathlib import Path

from workers import ActivityError, activity, current_activity

QUICK = {"backoff": timedelta(milliseconds=100)}


@activity(name="test:acts/basic.noop", **QUICK)
def noop() -> None:
    return None


@activity(name="test:acts/basic.add", **QUICK)
def add(a: int, b: int) -> int:
    return a + b


@activity(name="test:acts/basic.greet", **QUICK)
def greet(name: str, greeting: str = "Hello", times: int = 1) -> str:
    return " ".join([f"{greeting}, {name}!"] * times)


@activity(name="test:acts/basic.gc-state", **QUICK)
def gc_state() -> dict:
    """What the worker process running it tells of its garbage collector (D132)."""
    return {"frozen": gc.get_freeze_count(), "enabled": gc.isenabled(), "tracked": len(gc.get_objects())}


@activity(name="test:acts/basic.fail-until", max_retries=5, backoff=timedelta(milliseconds=200))
def fail_until(successful_attempt: int) -> int:
    """Raises until the given attempt; returns the attempt that succeeded."""
    attempt = current_activity().attempt
    if attempt < successful_attempt:
        raise RuntimeError(f"attempt {attempt} fails")
    return attempt


@activity(name="test:acts/basic.always-fails", max_retries=2, backoff=timedelta(milliseconds=100))
def always_fails() -> None:
    raise ValueError("this never works")


@activity(name="test:acts/basic.error-value", max_retries=0)
def error_value(code: str) -> str:
    raise ActivityError({"code": code}, retryable=False)


@activity(name="test:acts/basic.record", **QUICK)
def record(path: str) -> str:
    """Appends this execution's id and pid to ``path`` (one line per run)."""
    execution_id = current_activity().execution_id
    with open(path, "a") as out:
        out.write(f"{execution_id} {os.getpid()}\n")
    return execution_id


@activity(
    name="test:acts/slow.sleep",
    max_retries=1,
    backoff=timedelta(milliseconds=100),
    timeout=timedelta(seconds=1),
    lock_duration=timedelta(seconds=3),
)
def sleep_for(seconds: float, marker: str) -> str:
    """Notes each start in ``marker`` (pid, attempt), sleeps, then notes the end."""
    attempt = current_activity().attempt
    with open(marker, "a") as out:
        out.write(f"start {os.getpid()} {attempt}\n")
    time.sleep(seconds)
    with open(marker, "a") as out:
        out.write(f"end {os.getpid()} {attempt}\n")
    return "done"


@activity(
    name="test:acts/slow.stubborn",
    max_retries=0,
    timeout=timedelta(seconds=1),
    lock_duration=timedelta(seconds=3),
)
def stubborn(marker: str) -> str:
    """Swallows its interrupt and keeps going: only a hard stop ends it."""
    Path(marker).write_text(f"{os.getpid()}\n")
    end = time.monotonic() + 30
    while time.monotonic() < end:
        try:
            time.sleep(0.2)
        except BaseException:  # noqa: BLE001 - deliberately misbehaving activity
            pass
    return "never"


@activity(
    name="test:acts/slow.long",
    max_retries=0,
    timeout=timedelta(seconds=30),
    lock_duration=timedelta(seconds=1),
)
def long_running(seconds: float, marker: str) -> str:
    """Runs longer than its lock duration: the lock must be extended while it runs."""
    Path(marker).write_text(f"{os.getpid()}\n")
    time.sleep(seconds)
    return "finished"


@activity(
    name="test:acts/slow.hang",
    max_retries=3,
    backoff=timedelta(milliseconds=100),
    timeout=timedelta(seconds=60),
    lock_duration=timedelta(seconds=2),
)
def hang_once(marker: str) -> str:
    """First attempt: writes its pid to ``marker`` and hangs (to be killed); later: succeeds."""
    path = Path(marker)
    if not path.exists():
        path.write_text(f"{os.getpid()}\n")
        time.sleep(60)
    return f"finished by {os.getpid()}"


# Activities of the worker reliability tests (tests/workers/test_worker_reliability.py).


def _note(marker: str, what: str) -> None:
    """One line per event of a run: ``<what> <execution id> <pid> <attempt> <time.time()>``
    (a whole line in one ``write`` on an ``O_APPEND`` file: several processes may share it)."""
    context = current_activity()
    line = f"{what} {context.execution_id} {os.getpid()} {context.attempt} {time.time():.6f}\n"
    with open(marker, "a") as out:
        out.write(line)


@activity(
    name="test:acts/reliable.slow",
    max_retries=0,
    timeout=timedelta(seconds=10),
    lock_duration=timedelta(seconds=1),
)
def reliable_slow(seconds: float, marker: str) -> str:
    """No retries and a short lock: any lock expiry or lost claim shows as a failure. Notes
    its start and its end in ``marker`` (``_note``)."""
    _note(marker, "start")
    time.sleep(seconds)
    _note(marker, "end")
    return "slept"


@activity(name="test:acts/reliable.nul", **QUICK)
def returns_nul() -> str:
    """Returns a string PostgreSQL text cannot hold (U+0000)."""
    return "a\x00b"


@activity(
    name="test:acts/reliable.hang-no-retry",
    max_retries=0,
    timeout=timedelta(seconds=60),
    lock_duration=timedelta(seconds=1),
)
def hang_no_retry(marker: str) -> str:
    """Writes its pid to ``marker`` and hangs (to be killed); no retries."""
    Path(marker).write_text(f"{os.getpid()}\n")
    time.sleep(60)
    return "never"


@activity(name="test:acts/basic.chatty", **QUICK)
def chatty(x: int) -> int:
    """Prints and logs a warning: both land in its run's log (t_log)."""
    print(f"printing {x}")
    logging.getLogger("tests.support.components").warning("warning about %s", x)
    return x
