"""Workflows and activities of the workflow process tests
(``tests/workflows/test_workflow_processes.py``, ``tests/workers/test_parent_death.py``).

The worker clusters of those tests import this module next to ``tests.support.components``
(``OBELISK_COMPONENT_MODULES="tests.support.components,tests.support.workflow_components"``);
the test process imports it to submit the workflows.

- ``test:wfp/acts.work`` notes each start (execution id, attempt, pid, index) in a marker
  file, sleeps, and returns ``child_value(index)``: the marker file is the record of what
  actually ran, to be compared with the children's histories.
- ``test:wfp/wf.crash-await`` / ``-interrupt``: 20 children in one join set, a durable
  sleep, then one more child; ``expected_crash_result`` computes its result without any
  workflow machinery.
- ``test:wfp/acts.at-barrier`` waits until a common time and returns; ``test:wfp/wf.burst``
  submits many of them, so their responses arrive in one burst while it appends join-nexts
  (spec 000 §13.2 at the workflow level).
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

from executions.events import Ok
from workers import activity, current_activity, workflow

WORKFLOW_LOCK = timedelta(seconds=4)  # short: a killed cluster's workflow lock expires soon


def child_value(index: int) -> int:
    """What ``test:wfp/acts.work`` returns for ``index``."""
    return index * index + 7


def expected_crash_result(seconds: list[float]) -> dict:
    """The result of ``crash_await`` / ``crash_interrupt`` for ``seconds``, computed directly."""
    return {"values": [child_value(i) for i in range(len(seconds))], "last": child_value(len(seconds))}


def _append_line(path: str, line: str) -> None:
    """One whole line in one ``write`` on an ``O_APPEND`` file (several processes share it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@activity(
    name="test:wfp/acts.work",
    max_retries=5,
    backoff=timedelta(milliseconds=100),
    timeout=timedelta(seconds=10),
    lock_duration=timedelta(seconds=2),
)
def work(marker: str, index: int, seconds: float) -> int:
    """Notes its start (``<execution id> <attempt> <pid> <index>``), sleeps, returns
    ``child_value(index)``."""
    context = current_activity()
    _append_line(marker, f"{context.execution_id} {context.attempt} {os.getpid()} {index}\n")
    time.sleep(seconds)
    return child_value(index)


def _crash(ctx, marker: str, seconds: list[float]) -> dict:
    with ctx.join_set() as js:
        order = [js.submit(work, marker, index, s) for index, s in enumerate(seconds)]
        values = {}
        for _ in order:
            child_id, retval = js.await_next(work)
            values[child_id] = retval.value if isinstance(retval, Ok) else f"failed: {retval}"
    ctx.sleep(timedelta(seconds=1))
    last = ctx.call(work, marker, len(seconds), 0.1)
    return {"values": [values[child_id] for child_id in order], "last": last}


@workflow(name="test:wfp/wf.crash-await", blocking="await", lock_duration=WORKFLOW_LOCK)
def crash_await(ctx, marker: str, seconds: list[float]) -> dict:
    """Fan out ``len(seconds)`` children, await them all, sleep 1 s, call one more."""
    return _crash(ctx, marker, seconds)


@workflow(name="test:wfp/wf.crash-interrupt", blocking="interrupt", lock_duration=WORKFLOW_LOCK)
def crash_interrupt(ctx, marker: str, seconds: list[float]) -> dict:
    """``crash_await`` with the Interrupt strategy: every wait ends the run."""
    return _crash(ctx, marker, seconds)


@activity(
    name="test:wfp/acts.at-barrier",
    max_retries=3,
    backoff=timedelta(milliseconds=100),
    timeout=timedelta(seconds=20),
    lock_duration=timedelta(seconds=3),
)
def at_barrier(release_at: float, index: int) -> int:
    """Waits until ``release_at`` (a Unix time), then returns ``index``: every child of a
    burst finishes at the same moment (those claimed later at once)."""
    remaining = release_at - time.time()
    if remaining > 0:
        time.sleep(remaining)
    return index


@workflow(name="test:wfp/wf.burst", blocking="interrupt", lock_duration=WORKFLOW_LOCK)
def burst(ctx, n: int, release_after_ms: int) -> int:
    """``n`` children released together ``release_after_ms`` after the start, all awaited;
    returns the sum of their indexes. Interrupt: every join-next that finds no response ends
    the run, so only a response's wake-up (the store moving the row out of
    ``blocked_by_join_set``) can start the next run."""
    release_at = (ctx.now() + timedelta(milliseconds=release_after_ms)).timestamp()
    total = 0
    with ctx.join_set() as js:
        for index in range(n):
            js.submit(at_barrier, release_at, index)
        for _ in range(n):
            _, retval = js.await_next(at_barrier)
            total += retval.value if isinstance(retval, Ok) else 10**9
    return total


@workflow(name="test:wfp/wf.ready-interrupt", blocking="interrupt", lock_duration=WORKFLOW_LOCK)
def ready_interrupt(ctx, marker: str, n: int) -> int:
    """``n`` quick children, a 3 s sleep (long enough for all of them to finish), then every
    child awaited: the run after the sleep has every response loaded."""
    with ctx.join_set() as js:
        for index in range(n):
            js.submit(work, marker, index, 0.0)
        ctx.sleep(timedelta(seconds=3))
        return sum(js.await_next(work)[1].value for _ in range(n))


def undecorated_square(x: int) -> int:
    """A plain function, never decorated (issue 36 item 8): no workflow can call it."""
    return x * x


@workflow(name="test:wfp/wf.calls-undecorated", lock_duration=WORKFLOW_LOCK)
def calls_undecorated(ctx, x: int) -> int:
    """A child call of a plain function: an authoring mistake that must fail at once."""
    return ctx.call(undecorated_square, x)


@workflow(name="test:wfp/wf.local-clock", lock_duration=WORKFLOW_LOCK)
def local_clock(ctx) -> float:
    """The wall clock through an import inside the function (issue 36 item 9)."""
    import time

    return time.time()
