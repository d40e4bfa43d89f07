"""Admission of long polls (``GET /api/v1/executions/{id}/wait``), per server process.

A wait occupies a server thread for up to ``OBELISK['MAX_WAIT']``. Without a limit, a
caller with only the read permission could fill every thread of a server with waits (and,
before D100, every connection of the database). So a process serves at most
``MAX_WAITS_PER_PROCESS`` waits at once, and at most ``MAX_WAITS_PER_USER`` of one user;
past either, the wait is answered at once with 429 ``too_many_waits`` and a
``Retry-After`` (D101). The counts are this process's: a server of N processes serves up
to N times as many.
"""

from __future__ import annotations

import threading
from collections import Counter
from contextlib import contextmanager

from django.http import JsonResponse

from executions import conf
from obelisk_api import errors

CODE = "too_many_waits"
# Seconds a refused client waits before it asks again: long enough that a burst of
# refused clients does not keep the server's other threads busy, short against a wait.
RETRY_AFTER_SECONDS = 2

_lock = threading.Lock()
_per_user: Counter = Counter()


class TooManyWaits(Exception):
    """The process or the user already has as many waits open as allowed."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def response(self) -> JsonResponse:
        """The API's error shape, status 429, with ``Retry-After`` in seconds."""
        response = errors.json_error(429, CODE, self.message)
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response


def capped(timeout: float) -> float:
    """``timeout`` no longer than ``OBELISK['MAX_WAIT']`` (D102)."""
    return min(timeout, conf.get("MAX_WAIT").total_seconds())


def in_flight(user=None) -> int:
    """Waits open in this process now; of ``user`` only, if given."""
    with _lock:
        return _per_user[user.pk] if user is not None else sum(_per_user.values())


@contextmanager
def admitted(user):
    """Count a wait of ``user`` for as long as the block runs; ``TooManyWaits`` (before
    the block) past a cap."""
    per_process, per_user = conf.get("MAX_WAITS_PER_PROCESS"), conf.get("MAX_WAITS_PER_USER")
    with _lock:
        if sum(_per_user.values()) >= per_process:
            raise TooManyWaits(f"this server process already serves {per_process} waits; retry later")
        if _per_user[user.pk] >= per_user:
            raise TooManyWaits(f"you already have {per_user} waits open; retry later")
        _per_user[user.pk] += 1
    try:
        yield
    finally:
        with _lock:
            _per_user[user.pk] -= 1
            if not _per_user[user.pk]:
                del _per_user[user.pk]
