"""What a cluster's worker processes share about lingering for new work and claiming it.

A worker that has just run something waits briefly for more (``ActivityExecutor.
claim_and_run``) and is woken by LISTEN, so it claims new work itself. The broker, woken by
the same notification, then holds its claim task back for ``ExecutionBroker.REEMIT_AFTER``:
a claim task on top would only have a second worker race the lingering one for the same
row (measured: with 2 workers, one-at-a-time submission got slower than with 1). If the
work is still due after that, the claim task goes out, so a worker that died while counted
costs that delay, never an execution.

The lingering workers themselves are all woken by the same notification. The first to
claim takes the new execution; the others' claims would find nothing and cost a
transaction each. So each claim of activities records when it started, and one that was
not full records that it took everything then due (``covered``): a worker woken before such
a claim started skips its own (D57). A claim that another worker has started but not
finished is waited for briefly (``COVER_WAIT``), never longer: a worker killed in the
middle of its claim costs the others that delay once, never an execution.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time

COVER_WAIT = 0.02  # seconds a woken worker waits for a claim another worker is making

_count = None  # a multiprocessing Value shared by the cluster's processes (fork)
_claim_started = None  # monotonic start of the latest claim of activities (a shared Value)
_covered_since = None  # start of the latest claim that was not full: all due then was taken


def prepare_cluster() -> None:
    """Create the shared values in the ``obelisk_worker`` process, before the cluster forks."""
    global _count, _claim_started, _covered_since
    context = multiprocessing.get_context("fork")
    _count = context.Value("i", 0)
    _claim_started = context.Value("d", 0.0, lock=False)
    _covered_since = context.Value("d", 0.0, lock=False)


@contextlib.contextmanager
def lingering():
    """Count this worker as lingering while the block runs."""
    if _count is None:
        yield
        return
    with _count.get_lock():
        _count.value += 1
    try:
        yield
    finally:
        with _count.get_lock():
            _count.value -= 1


def someone_lingers() -> bool:
    return _count is not None and _count.value > 0


def covered(woken_at: float) -> bool:
    """Whether a claim that started after ``woken_at`` (when this worker was told of new
    work) took everything then due, so a claim of this worker would find nothing new.

    Such a claim's snapshot holds every commit announced before ``woken_at``; not being
    full, it took each due row it saw that no other claimer held. ``CLOCK_MONOTONIC``
    is one clock for all processes of the host."""
    if _covered_since is None:
        return False
    deadline = time.monotonic() + COVER_WAIT
    while _covered_since.value < woken_at:
        if _claim_started.value < woken_at or time.monotonic() >= deadline:
            return False  # nobody claimed since; or the claimer is slow, or died
        time.sleep(0.0005)
    return True


@contextlib.contextmanager
def claiming(limit: int):
    """Around one claim of activities: record its start, and once it returns fewer than
    ``limit`` executions, that it covered everything due when it started. The body
    stores the claimed batch in the yielded list."""
    started = time.monotonic()
    if _claim_started is not None:
        _claim_started.value = max(_claim_started.value, started)
    claimed: list = []
    yield claimed
    if _covered_since is not None and len(claimed) < limit:
        _covered_since.value = max(_covered_since.value, started)
