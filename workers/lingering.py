"""How many of a cluster's worker processes linger for new work: a counter they share.

A worker that has just run something waits briefly for more (``ActivityExecutor.
claim_and_run``) and is woken by LISTEN, so it claims new work itself. The broker, woken by
the same notification, then holds its claim task back for ``ExecutionBroker.REEMIT_AFTER``:
a claim task on top would only have a second worker race the lingering one for the same
row (measured: with 2 workers, one-at-a-time submission got slower than with 1). If the
work is still due after that, the claim task goes out, so a worker that died while counted
costs that delay, never an execution.
"""

from __future__ import annotations

import contextlib
import multiprocessing

_count = None  # a multiprocessing Value shared by the cluster's processes (fork)


def prepare_cluster() -> None:
    """Create the counter in the ``obelisk_worker`` process, before the cluster forks."""
    global _count
    _count = multiprocessing.get_context("fork").Value("i", 0)


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
