"""Run one locked activity execution in this process, for real.

The activity runs in the process's main thread; a ``Watchdog`` thread watches it:

- at the deadline it interrupts the activity (``SIGUSR1`` → ``ActivityTimedOut``); one that
  does not stop within ``grace`` has its outcome recorded by the watchdog, which ends the
  process (``os._exit``) for django-q2's sentinel to replace;
- it renews the lock (a heartbeat in ``t_state``) before a third of it is left, and
  interrupts a cancelled activity (``ActivityCancelled``);
- on a long run, a stop (``workers.shutdown``) or a dead parent (``workers.parent_death``)
  it has the executor hand back what has not started (``on_long_run``, ``on_stop``,
  ``on_orphaned``) and interrupts the running activity (``ActivityShutdown``).

A workflow's local child (D124) runs in the workflow's thread instead, watched by a
``LocalWatchdog``: the same deadlines, renewals, cancellations and hard stop, the interrupt
raised in that thread (``PyThreadState_SetAsyncExc``) rather than by a signal.

Every write of the run carries its fence (run id + lock generation).

why: D8, D24, D27, D28, D29, D96, D124
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime, timedelta  # the clock is datetime.now(UTC), never a settings read (D83)
from typing import Any

from django.db import connection
from pydantic import TypeAdapter

from executions import conf, errors, store
from executions.events import Err, Event, ExecutionFailure, Finished, Ok, Unlocked
from executions.outage import DATABASE_ERRORS, Outage, close_if_unusable_or_obsolete
from executions.state_machine import Lifecycle
from workers import parent_death, shutdown
from workers.activity import ActivityContext, ActivityError, running
from workers.capture import capturing
from workers.registry import ArgumentError, Function

logger = logging.getLogger("obelisk.runner")

HARD_STOP_EXIT_CODE = 70


class ActivityInterrupt(BaseException):
    """Raised inside an activity to stop it. A ``BaseException``, so ``except Exception``
    in user code does not swallow it."""


class ActivityTimedOut(ActivityInterrupt):
    pass


class ActivityCancelled(ActivityInterrupt):
    pass


class ActivityLockLost(ActivityInterrupt):
    """The run's lock was taken away (expired and swept, or re-locked)."""


class ActivityShutdown(ActivityInterrupt):
    """The worker is stopping and the activity outlived the shutdown grace period."""


class WatchedRun:
    """The watchdog's view of the run in progress; fields change under ``Watchdog.lock``."""

    def __init__(self, locked: store.LockedExecution, spec: Function):
        now = time.monotonic()
        self.execution_id = locked.execution_id
        self.fence = locked.fence
        self.spec = spec
        self.deadline = now + spec.timeout.total_seconds()
        self.lock_expires_at = locked.locked.lock_expires_at
        self.started = now
        self.next_cancel_check = now + Watchdog.CANCEL_CHECK_INTERVAL
        self.in_user_code = False
        self.pending: type[ActivityInterrupt] | None = None
        self.interrupted: type[ActivityInterrupt] | None = None
        self.interrupted_at: float | None = None
        self.flush_at: float | None = None
        self.hand_back_at: float | None = None
        self.closed = False


class Watchdog:
    """One per process: enforces deadlines, renews locks, delivers cancellations, and
    carries out a stop (``workers.shutdown``)."""

    CANCEL_CHECK_INTERVAL = 0.5
    IDLE_TICK = 0.25  # the idle watchdog looks for a new run (and a stop request) this often
    SLOW_RUN = 0.02  # a run this long gets the batch's finished results written meanwhile

    def __init__(self, grace: float = 2.0):
        self.grace = grace
        self.lock = threading.Condition()
        self.run: WatchedRun | None = None
        self.on_hard_stop: Callable[[], None] | None = None
        self.on_slow_run: Callable[[], None] | None = None
        self.on_long_run: Callable[[str], None] | None = None  # hand back the unstarted rest
        self.on_stop: Callable[[str], None] | None = None
        self.on_orphaned: Callable[[], bool] | None = None  # True: nothing held, the process may end
        self._stop_handled = False
        self._main = threading.main_thread().ident
        self._thread: threading.Thread | None = None
        self._outage = Outage(logger, "watchdog")

    def start(self) -> None:
        """Install the signal handler (main thread) and start the watchdog thread."""
        if self._thread is not None and self._thread.is_alive():
            return
        signal.signal(signal.SIGUSR1, self._on_signal)
        parent_death.arm_hand_back()  # from here on this process may hold locks (D96)
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._loop, name="obelisk-watchdog", daemon=True)
        self._thread.start()

    # -- main thread -------------------------------------------------------------------

    def _on_signal(self, signum, frame):
        run = self.run
        if run is not None and run.in_user_code and run.pending is not None:
            exception, run.pending = run.pending, None
            raise exception(f"activity {run.execution_id} interrupted: {exception.__name__}")

    def begin(self, run: WatchedRun, *, flush_if_slow: bool = False, hand_back_if_long: bool = False) -> None:
        """The activity starts. The watchdog thread is woken only if it must act before its
        next idle tick: waking it for every short activity would cost a GIL hand-off each.
        ``flush_if_slow``: results of earlier runs wait for a group commit; if this run turns
        out slow, the watchdog calls ``on_slow_run`` to write them meanwhile.
        ``hand_back_if_long``: executions claimed with this one wait behind it; if it runs
        longer than ``OBELISK['HAND_BACK_AFTER']``, ``on_long_run`` hands them back, so
        they neither wait nor let their locks expire (issue: claimed, never started)."""
        with self.lock:
            self.run = run
            run.in_user_code = True
            run.flush_at = run.started + self.SLOW_RUN if flush_if_slow else None
            if hand_back_if_long:
                run.hand_back_at = run.started + conf.get("HAND_BACK_AFTER").total_seconds()
            # The hand-back waits for the idle tick (at most IDLE_TICK late): waking the
            # watchdog for it would cost every short activity of a batch a GIL hand-off.
            wake = min(run.deadline, self._extension_due(run), run.flush_at or run.deadline)
            if wake < time.monotonic() + self.IDLE_TICK:
                self.lock.notify_all()

    def end(self, run: WatchedRun) -> None:
        """The activity returned or raised: no more interrupts or renewals for it."""
        with self.lock:
            run.in_user_code = False
            run.pending = None
            run.closed = True
            self.run = None

    # -- watchdog thread ---------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._step()

    def _step(self) -> None:
        try:
            self._tick()
            self._outage.recovered()
        except DATABASE_ERRORS as error:
            time.sleep(self._outage.failed(error))
        except Exception:  # never let the watchdog die
            logger.exception("watchdog tick failed")
            time.sleep(0.1)
        finally:
            if self.run is None:
                close_if_unusable_or_obsolete()

    def _tick(self) -> None:
        self._check_stop()
        self._check_orphaned()
        with self.lock:
            run = self.run
            if run is None or run.closed:
                self.lock.wait(self.IDLE_TICK)
                return
            now = time.monotonic()
            if run.interrupted is not None:  # the activity may still run: keep its lock
                if now >= run.interrupted_at + self.grace:
                    self._hard_stop(run)
                    return
                if not self._needs_extension(run):
                    wake = min(run.interrupted_at + self.grace, self._extension_due(run), now + self.IDLE_TICK)
                    self.lock.wait(max(0.0, wake - now))
                    return
        if run.interrupted is not None:
            if run.interrupted is not ActivityLockLost:
                self._extend(run)
            return
        with self.lock:
            now = time.monotonic()
            if now >= run.deadline:
                self._interrupt(run, ActivityTimedOut)
                return
            if self._grace_over():
                self._interrupt(run, ActivityShutdown)
                return
        if run.flush_at is not None and time.monotonic() >= run.flush_at:
            run.flush_at = None
            if self.on_slow_run is not None:
                self.on_slow_run()
        if run.hand_back_at is not None and time.monotonic() >= run.hand_back_at:
            run.hand_back_at = None
            if self.on_long_run is not None:
                self.on_long_run("handed back unstarted: an earlier execution of its batch runs long")
        if self._needs_extension(run):
            self._extend(run)
        if time.monotonic() >= run.next_cancel_check:
            run.next_cancel_check = time.monotonic() + self.CANCEL_CHECK_INTERVAL
            if self._cancel_requested(run):
                with self.lock:
                    if not run.closed:
                        self._interrupt(run, ActivityCancelled)
                return
        with self.lock:
            if run.closed or run.interrupted is not None:
                return
            now = time.monotonic()
            self.lock.wait(max(0.0, min(self._next_wake(run), now + self.IDLE_TICK) - now))

    def _next_wake(self, run: WatchedRun) -> float:
        return min(
            run.deadline,
            run.next_cancel_check,
            self._extension_due(run),
            run.flush_at or run.deadline,
            run.hand_back_at or run.deadline,
        )

    def _check_stop(self) -> None:
        """On the first tick after a stop request, hand back what has not started."""
        if not self._stop_handled and shutdown.stopping():
            self._stop_handled = True
            if parent_death.orphaned():
                logger.warning("the cluster's main process is gone: handing back and stopping (D96)")
            else:
                logger.info("stopping: handing back unstarted executions; running ones get %s", _grace())
            if self.on_stop is not None:
                self.on_stop("handed back unstarted: worker is stopping")

    def _check_orphaned(self) -> None:
        """The cluster's main process died (D96): the tick goes on (it interrupts the
        running activity at once, ``shutdown.grace``, and renews its lock until it stops);
        once the executor's claim task is over and its workflow runs have handed back
        (``on_orphaned``), the process ends. Nobody would replace it: the sentinel is gone."""
        if not parent_death.orphaned():
            return
        if self.on_orphaned is None or self.on_orphaned():
            logger.warning("the cluster's main process is gone: worker process %d ends", os.getpid())
            os._exit(0)

    def _grace_over(self) -> bool:
        asked = shutdown.stop_requested_at()
        return asked is not None and time.monotonic() >= asked + _grace().total_seconds()

    def _interrupt(self, run: WatchedRun, exception: type[ActivityInterrupt]) -> None:
        """Called with ``lock`` held."""
        run.interrupted = exception
        run.interrupted_at = time.monotonic()
        run.pending = exception
        logger.warning("interrupting %s: %s", run.execution_id, exception.__name__)
        signal.pthread_kill(self._main, signal.SIGUSR1)

    def _extension_due(self, run: WatchedRun) -> float:
        remaining = (run.lock_expires_at - datetime.now(UTC)).total_seconds()
        return time.monotonic() + remaining - run.spec.lock_duration.total_seconds() / 3

    def _needs_extension(self, run: WatchedRun) -> bool:
        return not run.closed and time.monotonic() >= self._extension_due(run)

    def _extend(self, run: WatchedRun) -> None:
        """Renew the lock (a heartbeat in ``t_state``, no event: ``store.extend_lock``)."""
        with self.lock:
            if run.closed:
                return
            expires = datetime.now(UTC) + run.spec.lock_duration
            try:
                lifecycle = store.extend_lock(run.execution_id, run.fence, expires)
            except (errors.LockLost, errors.IllegalState, errors.NotFound) as error:
                logger.warning("%s lost its lock: %s", run.execution_id, error)
                self._interrupt(run, ActivityLockLost)
                return
            run.lock_expires_at = expires
            if lifecycle == Lifecycle.CANCELLING and run.interrupted is None:
                self._interrupt(run, ActivityCancelled)

    def _cancel_requested(self, run: WatchedRun) -> bool:
        try:
            return store.get_state(run.execution_id).lifecycle == Lifecycle.CANCELLING
        except errors.NotFound:
            return False

    def _hard_stop(self, run: WatchedRun) -> None:
        """The activity ignored its interrupt: record the outcome and end the process."""
        logger.error("%s did not stop within %.1fs of %s; ending the worker process",
                     run.execution_id, self.grace, run.interrupted.__name__)  # fmt: skip
        try:
            if run.interrupted is not ActivityLockLost:
                event = interrupt_outcome(run, run.interrupted)
                store.append_many([store.AppendItem(run.execution_id, None, event, run.fence)])
            if self.on_hard_stop:
                self.on_hard_stop()
        finally:
            os._exit(HARD_STOP_EXIT_CODE)


class LocalWatchdog(Watchdog):
    """The watchdog of one activity run in a workflow's thread (a local child, D124): the
    ``Watchdog``'s deadline, lock renewals, cancellation checks, shutdown interrupt and hard
    stop, for a run in any thread. A thread takes no signal handler, so an interrupt is
    raised in the run's thread by ``PyThreadState_SetAsyncExc``: it lands at the next
    bytecode the thread runs, so an activity blocked in one long C call (a ``time.sleep`` of
    minutes, a socket read) cannot be interrupted, and past ``grace`` the process is
    hard-stopped, as for a main-thread activity that ignores its interrupt (its outcome
    recorded first, the other locks left to expire). The process's stop and orphan checks
    stay with the executor's own watchdog."""

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="obelisk-local-watchdog", daemon=True)
            self._thread.start()

    def begin(self, run: WatchedRun, *, flush_if_slow: bool = False, hand_back_if_long: bool = False) -> None:
        self._main = threading.get_ident()  # the run's thread: the one interrupted
        super().begin(run)

    def release(self) -> None:
        """After the run, however it ended: nothing more is watched. An interrupt is sent
        only while the run is in its user code and not closed, so at most the one sent as
        it returned may land here; it is dropped (the caller's ``run.interrupted`` tells).
        (A pending interrupt is not cleared with ``PyThreadState_SetAsyncExc(id, NULL)``:
        that leaves the interpreter's eval breaker set, and every thread of the process
        takes the slow path at every call from then on.)"""
        while True:
            try:
                with self.lock:
                    if self.run is not None:
                        self.run.in_user_code = False
                        self.run.closed = True
                        self.run = None
                return
            except ActivityInterrupt:
                continue

    def _check_stop(self) -> None:
        pass  # the executor's watchdog hands back on a stop; a local run is interrupted by _grace_over

    def _check_orphaned(self) -> None:
        pass  # the executor's watchdog ends the process

    def _interrupt(self, run: WatchedRun, exception: type[ActivityInterrupt]) -> None:
        """Called with ``lock`` held."""
        run.interrupted = exception
        run.interrupted_at = time.monotonic()
        run.pending = None
        logger.warning("interrupting local run %s: %s", run.execution_id, exception.__name__)
        if run.in_user_code and not run.closed:
            _raise_in_thread(self._main, exception)


def _raise_in_thread(thread_id: int, exception: type[BaseException]) -> None:
    """Raise ``exception`` in the thread ``thread_id`` at its next bytecode."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exception))


def _grace() -> timedelta:
    return shutdown.grace()


def interrupt_outcome(run: WatchedRun, interrupt: type[ActivityInterrupt]) -> Event | store.AttemptFailed:
    if interrupt is ActivityCancelled:
        return Finished(retval=ExecutionFailure("cancelled", "cancellation requested while running"))
    if interrupt is ActivityShutdown:
        if parent_death.orphaned():
            reason = "handed back: the cluster's main process is gone"
        else:
            reason = "handed back after the shutdown grace period: worker is stopping"
        return Unlocked(unlocked_at=datetime.now(UTC), reason=reason)
    reason = f"timed out after {run.spec.timeout.total_seconds():g} s"
    return store.AttemptFailed(reason, Finished(retval=ExecutionFailure("timed_out", reason)), timed_out=True)


def run_activity(
    locked: store.LockedExecution,
    spec: Function,
    watchdog: Watchdog,
    *,
    flush_if_slow: bool = False,
    hand_back_if_long: bool = False,
) -> store.AppendItem | None:
    """Run one attempt and return what to append for it (None: the run lost its lock)."""
    run = WatchedRun(locked, spec)
    # A run's results carry its fence and no version: a cancellation request appended while
    # it ran bumps the version but leaves the lock (and so the right to write) with the run.
    item = lambda event: store.AppendItem(locked.execution_id, None, event, locked.fence)  # noqa: E731
    try:
        args = spec.decode_arguments(locked.params)
    except ArgumentError as error:
        return item(Finished(retval=ExecutionFailure("uncategorized", f"parameters do not match: {error}")))
    context = ActivityContext(
        execution_id=locked.execution_id,
        ffqn=locked.ffqn,
        attempt=locked.intermittent_event_count + 1,
        run_id=locked.fence.run_id,
        deadline=datetime.now(UTC) + spec.timeout,
    )
    with running(context), capturing(locked.execution_id, locked.fence.run_id):
        try:
            watchdog.begin(run, flush_if_slow=flush_if_slow, hand_back_if_long=hand_back_if_long)
            try:
                value = spec.fn(*args)
            finally:
                watchdog.end(run)
            if run.interrupted is not None:  # the activity swallowed its interrupt
                raise run.interrupted("interrupt was suppressed by the activity")
            event = Finished(retval=Ok(spec.encode_result(value)))
        except ActivityLockLost:
            _discard_connection()
            return None
        except ActivityInterrupt as interrupt:
            _discard_connection()
            event = interrupt_outcome(run, type(interrupt))
        except ActivityError as error:
            event = _error_value_outcome(error)
        except ArgumentError as error:  # the return value does not match the declared type
            event = Finished(retval=ExecutionFailure("uncategorized", str(error)))
        except Exception as error:
            event = _failure_outcome(error)
    return item(event)


def _discard_connection() -> None:
    """An interrupt may land while the activity itself was using the database; start the
    run's own writes on a fresh connection."""
    if not connection.in_atomic_block:
        connection.close()


def _error_value_outcome(error: ActivityError) -> Event | store.AttemptFailed:
    try:
        value = TypeAdapter(Any).dump_python(error.value, mode="json")
    except Exception:
        value = repr(error.value)
    final = Finished(retval=Err(value))
    if not error.retryable:
        return final
    return store.AttemptFailed(f"activity returned an error: {value!r}", final)


def _failure_outcome(error: Exception) -> store.AttemptFailed:
    reason = f"{type(error).__name__}: {error}"
    detail = "".join(traceback.format_exception(error))
    return store.AttemptFailed(reason, Finished(retval=ExecutionFailure("uncategorized", reason, detail)), detail)


def before_start(locked: store.LockedExecution, spec: Function) -> tuple[bool, store.AppendItem | None]:
    """Whether to start ``locked`` now (``renew_before_start``), and if not, the result to
    write instead: a cancellation requested before it started, or nothing (its lock is
    gone). For a batch's run and a local child's alike."""
    lifecycle = renew_before_start(locked, spec)
    if lifecycle is None:
        return False, None
    if lifecycle == Lifecycle.CANCELLING:
        failure = ExecutionFailure("cancelled", "cancellation requested before it started")
        return False, store.AppendItem(locked.execution_id, None, Finished(retval=failure), locked.fence)
    return True, None


def renew_before_start(locked: store.LockedExecution, spec: Function) -> str | None:
    """A claimed execution that waited in its batch: renew its lock before running it if
    less than half is left. Returns its lifecycle (``"cancelling"``: do not start it), or
    None if the lock is already gone."""
    remaining = locked.locked.lock_expires_at - datetime.now(UTC)
    if remaining >= spec.lock_duration / 2:
        return Lifecycle.ACTIVE
    expires = datetime.now(UTC) + spec.lock_duration
    try:
        lifecycle = store.extend_lock(locked.execution_id, locked.fence, expires)
    except (errors.LockLost, errors.IllegalState, errors.NotFound) as error:
        logger.warning("%s: lock lost before the run started: %s", locked.execution_id, error)
        return None
    locked.locked = locked.locked.model_copy(update={"lock_expires_at": expires})
    return lifecycle
