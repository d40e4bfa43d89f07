"""Stopping a worker cluster in order (SIGTERM).

A stopping worker (``workers.executor``, ``workers.activity_runner``) claims nothing more, hands
back what it claimed but has not started (``Unlocked``, no retry used), lets a running
activity finish within ``OBELISK['SHUTDOWN_GRACE']``, then interrupts it and hands it back.
Who tells it to stop, and where:

- ``SIGTERM``/``SIGINT`` to ``obelisk_worker``: its handler only sets the cluster's shared
  stop flag (made here before the fork); the main loop passes it to django-q2's sentinel;
- ``SIGTERM`` to every process: the sentinel, pusher and monitor ignore it
  (``ignore_sigterm``); each worker marks itself stopping (``install_worker_handler``);
- the death of the parent process: each process finds out itself
  (``workers.parent_death``) and stops with no grace period.

why: D28, D29, D85, D96
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import signal
import time
from datetime import timedelta

from executions import conf
from workers import parent_death

logger = logging.getLogger("obelisk.shutdown")

_cluster_stopping = None  # a flag in memory shared by the cluster's processes (fork)
_stop_requested_at: float | None = None  # monotonic time this process learnt to stop
_told_alone = False  # this worker process got its own SIGTERM


def prepare_cluster() -> None:
    """Create the shared stop flag, and have every process of the cluster watch its
    parent (D96); call before the cluster forks its processes.

    A lock-free byte, not a ``multiprocessing.Event`` (D85): the flag is set in a signal
    handler, and a handler runs nested inside the one before it when signals come in a
    burst. ``Event.set`` takes a non-reentrant lock, so the nested handler waited for
    the one it interrupted and the cluster never stopped. One process writes the byte
    once; the others only read it (also on the executor's hot path, now without a lock)."""
    global _cluster_stopping
    _cluster_stopping = multiprocessing.get_context("fork").RawValue(ctypes.c_bool, False)
    parent_death.prepare_cluster()


def request_cluster_stop() -> None:
    """Tell every process of the cluster to stop. Safe in a signal handler: it takes no
    lock and does no I/O (D85)."""
    if _cluster_stopping is not None:
        _cluster_stopping.value = True
    _note_stop()


def stop_requested_at() -> float | None:
    """When this process learnt that it must stop (None: it need not): told, or its
    parent died (a ``getppid`` per call in a cluster's process: the loops that claim and
    renew ask here, D96)."""
    if _stop_requested_at is None and (_cluster_told() or parent_death.orphaned()):
        _note_stop()
    return _stop_requested_at


def grace() -> timedelta:
    """How long a running activity may go on once this process must stop: none when the
    cluster's main process died, which nobody waits for (D96)."""
    return timedelta(0) if parent_death.orphaned() else conf.get("SHUTDOWN_GRACE")


def _cluster_told() -> bool:
    """Whether the cluster's shared flag says stop (read without a lock, D85)."""
    return _cluster_stopping is not None and _cluster_stopping.value


def stopping() -> bool:
    return stop_requested_at() is not None


def _note_stop() -> None:
    global _stop_requested_at
    if _stop_requested_at is None:
        _stop_requested_at = time.monotonic()


def ignore_sigterm() -> None:
    try:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    except ValueError:  # not the main thread: nothing to install
        pass


def install_worker_handler(**_) -> None:
    """In a worker process (django-q2's ``post_spawn``): SIGTERM asks for a graceful stop.
    The handler only sets flags: the watchdog thread and the executor act on them."""

    def on_sigterm(signum, frame):
        global _told_alone
        _told_alone = True
        _note_stop()

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:
        pass


def leave_if_told_alone() -> None:
    """After a claim task: a worker that got its own SIGTERM while its cluster goes on
    exits, so the sentinel replaces it (a stopped worker must not sit in the pool)."""
    if _told_alone and not _cluster_told() and not parent_death.orphaned():  # else: its watchdog ends it
        logger.info("worker process stopping on SIGTERM; the cluster replaces it")
        raise SystemExit(0)
