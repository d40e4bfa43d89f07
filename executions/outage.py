"""Riding out database outages: capped back-off and one log line per outage.

A PostgreSQL restart or a network cut breaks every connection of every worker process at
once. The long-running loops (the broker, the timer sweep, the executors, the LISTEN
thread) must neither die nor print a traceback per attempt: each keeps an ``Outage``, calls
``failed(error)`` when a database call raised one of ``DATABASE_ERRORS`` and sleeps the
delay it returns, and calls ``recovered()`` after its next successful call. The first
failure logs one warning, the recovery one info line with the outage's length.
"""

from __future__ import annotations

import logging
import time

from django.db import InterfaceError, OperationalError, connection

try:  # the LISTEN thread talks to psycopg directly
    import psycopg

    DATABASE_ERRORS: tuple[type[BaseException], ...] = (
        OperationalError,
        InterfaceError,
        psycopg.OperationalError,
        psycopg.InterfaceError,
    )
except ImportError:  # pragma: no cover - SQLite-only installations
    DATABASE_ERRORS = (OperationalError, InterfaceError)

FIRST_DELAY = 0.05  # seconds
MAX_DELAY = 1.0  # so work resumes within about a second of the database coming back


class Outage:
    """The outage state of one loop (``what`` names it in the log)."""

    def __init__(self, logger: logging.Logger, what: str):
        self.logger = logger
        self.what = what
        self.started: float | None = None
        self.ended: float | None = None
        self._delay = FIRST_DELAY

    @property
    def ongoing(self) -> bool:
        return self.started is not None

    def failed(self, error: BaseException) -> float:
        """Record a failed database call; returns how long to wait before the next try."""
        if self.started is None:
            self.started = time.monotonic()
            self._delay = FIRST_DELAY
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            self.logger.warning("database unavailable (%s): %s; retrying", self.what, first_line)
        else:
            self._delay = min(MAX_DELAY, self._delay * 2)
        _discard_connection()
        return self._delay

    def recovered(self) -> None:
        """Record a successful database call (cheap when there was no outage)."""
        if self.started is not None:
            self.logger.info("database available again (%s) after %.1f s", self.what, time.monotonic() - self.started)
            self.started = None
            self.ended = time.monotonic()

    def wait(self, error: BaseException) -> None:
        """``failed`` and sleep."""
        time.sleep(self.failed(error))


def close_if_unusable_or_obsolete() -> None:
    """Django's ``close_if_unusable_or_obsolete`` for a thread that must outlive it (the
    watchdog, a workflow pool's thread): close this thread's connection if it broke or grew
    old, and never raise. A failure to close it (a broken connection whose close fails too)
    is retried at the next call."""
    try:
        connection.close_if_unusable_or_obsolete()
    except Exception as error:
        logging.getLogger(__name__).debug("closing an idle connection failed: %s", error)


def _discard_connection() -> None:
    """A broken connection is useless: the next call must open a fresh one."""
    try:
        if not connection.in_atomic_block:
            connection.close()
    except DATABASE_ERRORS:
        pass
