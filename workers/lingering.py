"""What a cluster's worker processes share about lingering for new work and claiming it.

A worker that has just run something waits briefly for more, woken by the cluster's
doorbell (``workers.doorbell``), and claims new work itself; the broker holds its claim
task back meanwhile (``ExecutionBroker.REEMIT_AFTER``). This module is the memory, made
before the fork, through which the lingering workers avoid racing each other:

- each claim of activities records when it started and whether it took everything then
  due (``covered``): a worker woken before such a claim skips its own (``COVER_WAIT``);
- a worker running a short batch counts as busy (``batch_started``, ``BUSY_DEFER``), so a
  woken worker leaves the new work to it until that batch is expected to end;
- a worker waiting ``CLAIM_COALESCE`` for more of a stream counts as finishing until its
  window ends (``claims_within``).

why: D24, D57, D58, D86, D89
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time

COVER_WAIT = 0.02  # seconds a woken worker waits for a claim another worker is making
BUSY_DEFER = 0.02  # a batch expected to take at most this long is waited for (D58)
BUSY_SLACK = 0.003  # seconds from a batch's expected end to its worker's next claim
POLL = 0.001  # seconds between looks at the shared values while waiting

_count = None  # a multiprocessing Value shared by the cluster's processes (fork)
_claim_started = None  # monotonic start of the latest claim of activities (a shared Value)
_covered_since = None  # start of the latest claim that was not full: all due then was taken
_busy = None  # workers that ran a batch of activities and have not started their next claim
_busy_until = None  # monotonic time the latest such batch is expected to be written by
_busy_here = False  # this process is counted in ``_busy``


def prepare_cluster() -> None:
    """Create the shared values in the ``obelisk_worker`` process, before the cluster forks."""
    global _count, _claim_started, _covered_since, _busy, _busy_until
    context = multiprocessing.get_context("fork")
    _count = context.Value("i", 0)
    _claim_started = context.Value("d", 0.0, lock=False)
    _covered_since = context.Value("d", 0.0, lock=False)
    _busy = context.Value("i", 0)
    _busy_until = context.Value("d", 0.0, lock=False)


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
    is one clock for all processes of the host. It waits while such a claim may still
    come: one has started (for up to ``COVER_WAIT``), or, when this worker is not busy
    itself, another is finishing a short batch, after which it claims (until that batch's
    expected end)."""
    if _covered_since is None:
        return False
    while _covered_since.value < woken_at:
        now = time.monotonic()
        claiming = _claim_started.value >= woken_at and now < woken_at + COVER_WAIT
        # Only a worker not busy itself defers: two busy ones would wait for each other.
        others_busy = _busy is not None and not _busy_here and _busy.value > 0
        finishing = others_busy and now < _busy_until.value
        if not (claiming or finishing):
            return False  # nobody will claim it soon: none started, or slow, died, or busy long
        time.sleep(POLL)
    return True


def batch_started(expected_seconds: float) -> None:
    """This worker runs a claimed batch of activities, expected to take ``expected_seconds``
    (its previous batch's time) until written: it counts as busy until its next claim has
    started (``claiming``), or it stops claiming (``idle``). Counting it until then, not
    only while the batch runs, leaves no moment in which a woken worker sees neither the
    batch nor the claim after it."""
    global _busy_here
    if _busy is None:
        return
    if not _busy_here:
        with _busy.get_lock():
            _busy.value += 1
        _busy_here = True
    short = expected_seconds <= BUSY_DEFER
    _busy_until.value = time.monotonic() + 1.5 * expected_seconds + BUSY_SLACK if short else 0.0


def claims_within(seconds: float) -> None:
    """This busy worker makes its next claim within ``seconds`` (it waits for more of a
    stream first, D86): woken workers leave the new work to it until then, as they do
    while its batch runs (D58), instead of splitting the stream into claims of one."""
    if _busy is not None and _busy_here:
        _busy_until.value = max(_busy_until.value, time.monotonic() + seconds + BUSY_SLACK)


def idle() -> None:
    """This worker no longer counts as busy (its claim started, or its claim task ends)."""
    global _busy_here
    if _busy is not None and _busy_here:
        with _busy.get_lock():
            _busy.value -= 1
        _busy_here = False


@contextlib.contextmanager
def claiming(limit: int):
    """Around one claim of activities: record its start, and once it returns fewer than
    ``limit`` executions, that it covered everything due when it started. The body
    stores the claimed batch in the yielded list."""
    started = time.monotonic()
    if _claim_started is not None:
        _claim_started.value = max(_claim_started.value, started)
    idle()  # after the claim's start is visible: a woken worker sees one or the other
    claimed: list = []
    yield claimed
    if _covered_since is not None and len(claimed) < limit:
        _covered_since.value = max(_covered_since.value, started)
