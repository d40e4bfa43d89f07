"""Logs and std streams of runs, captured into ``t_log`` (spec 000 §2.6; spec 002 §2.15).

While a run executes (an activity in a worker's main thread, a workflow in a thread of its
own), whatever it logs through ``logging`` and writes to ``sys.stdout``/``sys.stderr`` is
kept for that run, with its level and time, and stored with the run's execution and run ids
when the run ends (``store.append_logs``, one transaction, only if anything was captured).
The output still reaches the worker's own log as before.

Logging is captured at the levels the logging configuration lets through (the ``obelisk``
loggers, ``ctx.log`` included, at INFO; the root at ``OBELISK_LOG_LEVEL``/WARNING). While a
workflow replays, ``ctx.log`` demotes what it logs again to DEBUG (``workers.workflow``), and
whatever still gets through is stored at trace level marked ``(replay)``, so a replay does
not read as new activity.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime

logger = logging.getLogger("obelisk.capture")
_current = threading.local()
_installed = False
MAX_ENTRIES = 1000  # per run: a run that logs more keeps its first entries

TRACE, DEBUG, INFO, WARN, ERROR = 1, 2, 3, 4, 5


def _level(levelno: int) -> int:
    if levelno >= logging.ERROR:
        return ERROR
    if levelno >= logging.WARNING:
        return WARN
    if levelno >= logging.INFO:
        return INFO
    return DEBUG if levelno >= logging.DEBUG else TRACE


class RunLog:
    """What one run logged, in order."""

    def __init__(self, replaying: Callable[[], bool]):
        self.replaying = replaying
        self.records: list[tuple[datetime, int, str]] = []
        self.streams: list[tuple[datetime, int, bytes]] = []

    def save(self, execution_id: str, run_id: str) -> None:
        """Store what was captured under ``run_id`` (one transaction, if anything was), and
        start afresh. Best effort: a run never fails for its logs."""
        from executions import store

        if not (self.records or self.streams):
            return
        records, streams, self.records, self.streams = self.records, self.streams, [], []
        try:
            store.append_logs(execution_id, run_id, records, streams)
        except Exception as error:
            logger.warning("logs of %s not stored: %s", execution_id, error)

    def full(self) -> bool:
        return len(self.records) + len(self.streams) >= MAX_ENTRIES

    def add_record(self, record: logging.LogRecord) -> None:
        if self.full():
            return
        try:
            message = record.getMessage()
        except Exception:  # a broken format string must not break the run
            message = str(record.msg)
        if record.exc_info:
            message += "\n" + logging.Formatter().formatException(record.exc_info)
        level = _level(record.levelno)
        if self.replaying() and not message.startswith("(replay) "):
            level, message = TRACE, f"(replay) {message}"
        elif message.startswith("(replay) "):
            level = TRACE
        self.records.append((datetime.now(UTC), level, message))

    def add_stream(self, stream: int, text: str) -> None:
        """Consecutive writes to one stream (``print`` writes its pieces one by one) make one
        chunk, until a line is complete."""
        if not text or self.full():
            return
        payload = text.encode("utf-8", "backslashreplace")
        if self.streams and self.streams[-1][1] == stream and not self.streams[-1][2].endswith(b"\n"):
            at, _, previous = self.streams[-1]
            self.streams[-1] = (at, stream, previous + payload)
        else:
            self.streams.append((datetime.now(UTC), stream, payload))


class _CaptureHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        run = getattr(_current, "run", None)
        if run is not None and record.name != logger.name:
            run.add_record(record)


class _Tee(io.TextIOBase):
    """A std stream that also hands what the current run writes to its ``RunLog``."""

    def __init__(self, original, stream: int):
        self._original = original
        self._stream = stream

    def write(self, text: str) -> int:
        run = getattr(_current, "run", None)
        if run is not None:
            run.add_stream(self._stream, text)
        return self._original.write(text)

    def flush(self) -> None:
        self._original.flush()

    def fileno(self) -> int:
        return self._original.fileno()

    def isatty(self) -> bool:
        return self._original.isatty()

    @property
    def encoding(self):
        return getattr(self._original, "encoding", "utf-8")


def install() -> None:
    """Once per worker process: the capturing handler and the std stream tees."""
    global _installed
    if _installed:
        return
    _installed = True
    logging.getLogger().addHandler(_CaptureHandler())
    sys.stdout = _Tee(sys.stdout, 1)
    sys.stderr = _Tee(sys.stderr, 2)


@contextlib.contextmanager
def capturing(execution_id: str, run_id: str | Callable[[], str], replaying: Callable[[], bool] = lambda: False):
    """Capture what the current thread logs and prints into ``execution_id``'s log.
    ``run_id``: the run's, or where a parked workflow run goes on under a new lock (D77),
    a function that tells the current one."""
    install()
    run = RunLog(replaying)
    previous = getattr(_current, "run", None)
    _current.run = run
    try:
        yield run
    finally:
        _current.run = previous
        run.save(execution_id, run_id() if callable(run_id) else run_id)
