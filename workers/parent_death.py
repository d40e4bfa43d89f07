"""A cluster whose main process died ends itself (D96).

The OOM killer ends one process with ``SIGKILL``: the ``obelisk_worker`` process, never its
children. django-q2's sentinel, pusher, monitor and workers then ran on without it:
renewing locks, claiming and running new work, while the dashboard showed the cluster as
gone (its heartbeat lives in the main process). So every process of a cluster watches the
process that forked it (main → sentinel → pusher, monitor, workers):

- right after each fork (``os.register_at_fork``, installed by ``prepare_cluster`` in the
  main process) the child asks the kernel for ``SIGKILL`` when its parent dies
  (``PR_SET_PDEATHSIG``, Linux), then checks that its parent is still the process that
  forked it: a parent that died before the request would never signal;
- ``SIGKILL`` suits a process that holds nothing (the sentinel, which must not live on to
  replace the workers that leave, the pusher, the monitor, a worker before its first
  claim). A worker about to claim (``arm_hand_back``, from its watchdog's start) swaps it
  for ``SIGUSR2``, whose handler only takes note: it then stops as a stopping worker does
  (``workers.shutdown``), but without the grace period: it claims nothing more, hands
  back what it claimed and interrupts the running activity, which is handed back too
  (``Unlocked``, no retry used); its watchdog ends the process once its claim task and
  workflow runs are over (``workers.activity_runner``);
- ``orphaned()`` compares ``os.getppid()`` with the parent recorded at the fork: the
  portable fallback, asked by the loops that claim (``shutdown.stopping()``), renew (the
  watchdog's tick), dequeue (the pusher) and guard (the sentinel's statistics).

A process forked deeper (by an activity) is not the cluster's, and is left alone. Outside a
cluster (tests, scripts) nothing is installed and ``orphaned()`` is always False.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

logger = logging.getLogger("obelisk.shutdown")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
HAND_BACK_SIGNAL = signal.SIGUSR2  # SIGUSR1 interrupts activities (``workers.activity_runner``)
_CLUSTER_DEPTH = 2  # main (0) → sentinel (1) → pusher, monitor, workers (2)

_prctl = None  # libc's prctl, looked up before the fork (no dynamic loading in a child)
_depth: int | None = None  # forks between this process and the main process; None: no cluster
_forked_by = 0  # in the parent, just before a fork: its own pid (the child's expected parent)
_expected_parent: int | None = None  # this process's parent at its fork; None: not watched
_orphaned = False


def prepare_cluster() -> None:
    """In the ``obelisk_worker`` process, before django-q2 forks the cluster: every
    process forked from here on, down to the workers, watches its parent."""
    global _depth, _prctl
    if _depth is not None:
        return
    _depth = 0
    _prctl = _libc_prctl()
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def orphaned() -> bool:
    """Whether this process's parent died (always False outside a cluster's processes)."""
    global _orphaned
    if not _orphaned and _expected_parent is not None and os.getppid() != _expected_parent:
        _orphaned = True
    return _orphaned


def exit_if_orphaned() -> None:
    """For a process that holds nothing (the sentinel, the pusher): end it at once."""
    if orphaned():
        logger.warning("process %d: its parent %s is gone; ending", os.getpid(), _expected_parent)
        os._exit(0)


def arm_hand_back() -> None:
    """In a worker process's main thread, before its first claim: from now on it may hold
    locks, so the death of its parent must not kill it but make it hand them back. The
    handler only takes note (D85: a handler takes no lock); the watchdog acts on it."""
    if _expected_parent is None:
        return
    try:
        signal.signal(HAND_BACK_SIGNAL, _on_parent_death)
    except ValueError:  # not the main thread: the parent-pid check alone serves
        return
    _set_death_signal(HAND_BACK_SIGNAL)
    orphaned()  # the parent may have died before the new signal was set


def _on_parent_death(signum, frame) -> None:
    orphaned()  # a stray SIGUSR2 with the parent alive changes nothing


def _before_fork() -> None:
    global _forked_by
    _forked_by = os.getpid()


def _after_fork_in_child() -> None:
    """Right after the fork, in the child: ask for ``SIGKILL`` at the parent's death, then
    make sure the parent did not die before that."""
    global _depth, _expected_parent, _orphaned
    _depth += 1
    _orphaned = False
    if _depth > _CLUSTER_DEPTH:
        _expected_parent = None
        return
    _expected_parent = _forked_by
    _set_death_signal(signal.SIGKILL)
    if os.getppid() != _expected_parent:  # it died first: this process holds nothing yet
        os._exit(0)


def _set_death_signal(signum: int) -> None:
    args = (ctypes.c_ulong(int(signum)), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
    if _prctl is not None and _prctl(PR_SET_PDEATHSIG, *args) != 0:
        logger.warning("PR_SET_PDEATHSIG failed (errno %d); the parent-pid check serves", ctypes.get_errno())


def _libc_prctl():
    """libc's ``prctl`` on Linux, else None (the parent-pid check alone serves)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
