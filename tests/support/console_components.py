"""A workflow that leaves every kind of event an operator reads on the execution page, run
by a real worker cluster for the console's browser tests (``tests/console/test_console_browser.py``;
the cluster imports ``tests.support.components,tests.support.console_components``).

``test:console/wf.tour`` asks for the time (``ctx.now()``, a ``Persist`` event), starts a
child that fails for good (no retries) and one that succeeds in one join set, reads the
failure first, then sleeps on a durable delay and returns. Its history holds children,
responses (a failure first), a delay and its response, and a persisted time: every
version of it is a page time travel must show.
"""

from __future__ import annotations

from datetime import timedelta

from workers import activity, workflow

TOUR = "test:console/wf.tour"


@activity(name="test:console/acts.breaks", max_retries=0)
def breaks(code: str) -> int:
    raise ValueError(f"broken on purpose: {code}")


@activity(name="test:console/acts.triple", max_retries=0)
def triple(x: int) -> int:
    return 3 * x


@workflow(name=TOUR, lock_duration=timedelta(seconds=10))
def tour(ctx, x: int) -> dict:
    started = ctx.now()
    _, failure = ctx.invoke(breaks, "E1", label="breaks")
    value = ctx.call(triple, x)
    slept_until = ctx.sleep(timedelta(milliseconds=50))
    return {
        "started": started.isoformat(),
        "failure": type(failure).__name__,
        "value": value,
        "slept_until": slept_until.isoformat(),
    }
