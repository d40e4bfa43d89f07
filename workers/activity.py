"""The authoring API of activities: ``@activity``, ``ActivityError``, ``current_activity()``.

::

    from workers import ActivityError, activity, current_activity

    @activity(max_retries=3, backoff=timedelta(seconds=1), timeout=timedelta(seconds=5))
    def greet(name: str) -> str:
        return f"Hello, {name}! (attempt {current_activity().attempt})"

This module imports no worker runtime and no Django, so application code can import it
anywhere; the runner (``workers/activity_runner.py``) sets the context while an activity runs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from workers.registry import (
    DEFAULT_BACKOFF,
    DEFAULT_LOCK_DURATION,
    DEFAULT_MAX_RETRIES,
    DEFAULT_TIMEOUT,
    Function,
    build,
    check_target,
    register,
)


class ActivityError(Exception):
    """Raise from an activity to return an error *value* (``{"err": value}``).

    Retried like any failure while retries remain (``retryable=False`` finishes at once);
    the last attempt's value is the execution's result, so a parent can tell it apart from
    a crash (``execution_failure``).
    """

    def __init__(self, value: Any = None, *, retryable: bool = True):
        super().__init__(value)
        self.value = value
        self.retryable = retryable


@dataclass(frozen=True)
class ActivityContext:
    """What a running activity may know about itself (``current_activity()``)."""

    execution_id: str
    ffqn: str
    attempt: int
    run_id: str
    deadline: datetime


_CONTEXT: contextvars.ContextVar[ActivityContext | None] = contextvars.ContextVar("obelisk_activity", default=None)


def current_activity() -> ActivityContext:
    """The running activity's context; ``RuntimeError`` outside an activity."""
    context = _CONTEXT.get()
    if context is None:
        raise RuntimeError("not inside a running activity")
    return context


@contextlib.contextmanager
def running(context: ActivityContext):
    """Set ``current_activity()`` for the duration of one attempt (the runner's side)."""
    token = _CONTEXT.set(context)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def activity(
    fn: Callable | None = None,
    *,
    name: str | None = None,
    max_retries: int | None = DEFAULT_MAX_RETRIES,
    backoff: timedelta = DEFAULT_BACKOFF,
    timeout: timedelta = DEFAULT_TIMEOUT,
    lock_duration: timedelta = DEFAULT_LOCK_DURATION,
):
    """Register ``fn`` as an activity; usable bare (``@activity``) or with options.

    ``max_retries`` None retries forever; the n-th retry waits ``backoff * 2^(n-1)``.
    ``timeout`` bounds one attempt (the attempt is stopped, then retried as a timeout);
    ``lock_duration`` is how long a worker holds the execution between lock extensions.
    """

    def decorate(target: Callable) -> Function:
        return register(build(target, name, max_retries, backoff, timeout, lock_duration))

    check_target(fn, "@activity")
    return decorate(fn) if fn is not None else decorate
