"""Workflows and activities of the local-activity tests (``tests/workers/test_local_activities.py``).

A sequential ``ctx.call`` of an activity the workflow's own worker serves runs in the
workflow's thread (D124). The worker clusters of those tests import this module next to
``tests.support.components`` (``MODULES``); the test process imports it to submit the
workflows. The activities note each start and end in a marker file
(``<what> <execution id> <attempt> <pid> <thread> <index>``): the record of what ran where,
to be compared with the histories. ``tests/support/local_gate.py`` holds the hooks, in a
module of its own (the determinism guard rebinds ``time`` and ``os`` in this one).
"""

from __future__ import annotations

from datetime import timedelta

from tests.support import local_gate
from workers import activity, current_activity, workflow
from workers.workflow import ChildFailed

MODULES = "tests.support.components,tests.support.local_components"
WORKFLOW_LOCK = timedelta(seconds=4)  # short: a killed cluster's workflow lock expires soon


def step_value(index: int) -> int:
    """What ``test:local/acts.step`` returns for ``index``."""
    return index * 10 + 1


def _note(marker: str, what: str, index: int) -> None:
    context = current_activity()
    local_gate.note(marker, f"{what} {context.execution_id} {context.attempt} {local_gate.where()} {index}")


@activity(
    name="test:local/acts.step",
    max_retries=3,
    backoff=timedelta(milliseconds=100),
    timeout=timedelta(seconds=60),
    lock_duration=timedelta(seconds=1),
)
def step(marker: str, index: int, gate: str) -> int:
    """Notes its start; with a ``gate`` its first attempt waits for that file (a test kills
    the worker meanwhile), renewing its 1 s lock all along; notes its end."""
    _note(marker, "start", index)
    if gate and current_activity().attempt == 1:
        local_gate.hold(gate, 50)
    _note(marker, "end", index)
    return step_value(index)


@activity(
    name="test:local/acts.flaky",
    max_retries=3,
    backoff=timedelta(milliseconds=200),
    timeout=timedelta(seconds=20),
    lock_duration=timedelta(seconds=2),
)
def flaky(marker: str, index: int) -> int:
    """Fails its first two attempts (an exception: retried with back-off), then returns."""
    _note(marker, "start", index)
    if current_activity().attempt <= 2:
        raise RuntimeError(f"attempt {current_activity().attempt} fails")
    return step_value(index)


@activity(
    name="test:local/acts.stuck",
    max_retries=0,
    timeout=timedelta(seconds=1),
    lock_duration=timedelta(seconds=3),
)
def stuck(marker: str, index: int) -> int:
    """Runs far past its 1 s timeout (in short sleeps: the interrupt lands between two)."""
    _note(marker, "start", index)
    local_gate.spin(30)
    _note(marker, "end", index)
    return step_value(index)


@activity(
    name="test:local/acts.long",
    max_retries=0,
    timeout=timedelta(seconds=40),
    lock_duration=timedelta(seconds=2),
)
def long(marker: str, index: int) -> int:
    """Runs until it is interrupted (a cancellation), up to 30 s."""
    _note(marker, "start", index)
    local_gate.spin(30)
    _note(marker, "end", index)
    return step_value(index)


@workflow(name="test:local/wf.steps", blocking="await", lock_duration=WORKFLOW_LOCK)
def steps(ctx, marker: str, n: int, gates: dict) -> list:
    """``n`` sequential calls of ``step``; ``gates``: for a call's index (as text), the gate its
    first attempt waits for (``"child"``), or the gate the workflow waits for after the call
    returned (``"after"``, noted as ``after <index>``), before going on."""
    values = []
    for index in range(n):
        gate = gates.get(str(index), {})
        values.append(ctx.call(step, marker, index, gate.get("child", "")))
        if gate.get("after"):  # on replay too: the gate is there by then
            local_gate.note(marker, f"after {index}")
            local_gate.hold(gate["after"], 50)
    return values


@workflow(name="test:local/wf.calls", blocking="await", lock_duration=WORKFLOW_LOCK)
def calls(ctx, marker: str, ffqn: str, index: int) -> object:
    """One call of ``ffqn``; its value, or the child's failure as text."""
    try:
        return ctx.call(ffqn, marker, index)
    except ChildFailed as failed:
        return f"failed: {failed.retval}"


@workflow(name="test:local/wf.step-then-call", blocking="await", lock_duration=WORKFLOW_LOCK)
def step_then_call(ctx, marker: str, ffqn: str, index: int) -> object:
    """A call of ``step``, then one of ``ffqn``: the second's value, or its failure as text."""
    ctx.call(step, marker, 0, "")
    try:
        return ctx.call(ffqn, marker, index)
    except ChildFailed as failed:
        return f"failed: {failed.retval}"


@workflow(name="test:local/wf.steps-interrupt", blocking="interrupt", lock_duration=WORKFLOW_LOCK)
def steps_interrupt(ctx, marker: str, n: int) -> list:
    """``n`` sequential calls of ``step`` under Interrupt: today's path (handed over)."""
    return [ctx.call(step, marker, index, "") for index in range(n)]
