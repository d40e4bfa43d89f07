"""Workflows and activities of the testing toolkit's tests (``tests/testing_toolkit/``)
and of its benchmark (``bench/testing_toolkit.py``), run by ``workers.testing.run_workflow``.

A workflow module: ``@workflow`` guards its names (``time`` below raises inside a running
workflow). No ``from __future__ import annotations``: the registry reads the annotations.
"""

import time
from datetime import timedelta

from workers import ActivityError, activity, current_activity, workflow
from workers.workflow import ChildFailed

# ---------------------------------------------------------------------------------------------
# Activities
# ---------------------------------------------------------------------------------------------


@activity(max_retries=3, backoff=timedelta(minutes=5))
def fetch(key: str) -> int:
    """Stands for a call to the outside world: the tests stub it."""
    raise ConnectionError(f"no network in tests (fetching {key})")


@activity(max_retries=0)
def step(n: int) -> int:
    return n + 1


@activity(max_retries=2, backoff=timedelta(seconds=30))
def whoami(label: str) -> dict:
    """Runs for real: ``current_activity()`` answers in-process as in a worker."""
    context = current_activity()
    return {"label": label, "attempt": context.attempt, "execution_id": context.execution_id}


@activity(max_retries=0)
def refuse(reason: str) -> str:
    raise ActivityError({"refused": reason}, retryable=False)


# ---------------------------------------------------------------------------------------------
# Workflows
# ---------------------------------------------------------------------------------------------


@workflow
def five_steps_and_an_hour(ctx, n: int, sleep_seconds: float = 3600) -> dict:
    """Five activities and a one-hour sleep (the benchmark's workflow; a real worker cannot
    skip the hour, so its runs sleep ``sleep_seconds``)."""
    for _ in range(3):
        n = ctx.call(step, n)
    ctx.sleep(timedelta(seconds=sleep_seconds))
    for _ in range(2):
        n = ctx.call(step, n)
    return {"n": n, "at": ctx.now().isoformat()}


@workflow
def sleeps_a_day(ctx) -> dict:
    before = ctx.now()
    fired = ctx.sleep(timedelta(days=1))
    after = ctx.now()
    return {"before": before.isoformat(), "fired": fired.isoformat(), "after": after.isoformat()}


@workflow
def races_a_delay(ctx, key: str) -> dict:
    """The fetch against a 10-minute delay: whichever comes first; leaving the join set
    cancels the other (a slow fetch, retried with back-off, is cancelled)."""
    with ctx.join_set() as js:
        fetched = js.submit(fetch, key)
        js.submit_delay(timedelta(minutes=10))
        first, _ = js.join_next()
    return {"winner": "fetch" if first == fetched else "delay", "at": ctx.now().isoformat()}


@workflow
def schedules_a_step(ctx, n: int) -> str:
    """Schedules a step two days later (a new top-level execution) and returns its id."""
    return ctx.schedule(step, n, at=timedelta(days=2))


@workflow
def fetches(ctx, key: str) -> dict:
    value = ctx.call(fetch, key)
    return {"key": key, "value": value}


@workflow
def fetches_twice(ctx) -> list:
    return [ctx.call(fetch, "a"), ctx.call(fetch, "b")]


@workflow
def asks_who(ctx) -> dict:
    return ctx.call(whoami, "me")


@workflow
def child_fetches(ctx, key: str) -> int:
    return ctx.call(fetch, key) * 10


@workflow
def parent_of_child(ctx, key: str) -> dict:
    """A child workflow; its failure reaches the parent as ``ChildFailed``."""
    try:
        return {"child": ctx.call(child_fetches, key)}
    except ChildFailed as failed:
        return {"child_failed": str(failed.retval)}


@workflow
def gets_refused(ctx) -> str:
    try:
        return ctx.call(refuse, "no")
    except ChildFailed as failed:
        return f"refused: {failed.retval}"


@workflow
def reads_the_clock(ctx) -> float:
    """Breaks the rules: the determinism guard stops it."""
    ctx.call(step, 1)
    return time.time()


FLIPS = {"count": 0}


@workflow
def flips(ctx) -> int:
    """Nondeterministic: asks for ``step`` on its first run and ``fetch`` on the next ones
    (state kept outside the history, which a crashed worker's successor would not have)."""
    FLIPS["count"] += 1
    if FLIPS["count"] == 1:
        return ctx.call(step, 1)
    return ctx.call(fetch, "x")


@workflow
def changes_with(ctx, n: int) -> int:
    """The code a history is exported from; a test replays it against ``changed``."""
    first = ctx.call(step, n)
    ctx.sleep(timedelta(minutes=5))
    return ctx.call(step, first)
