"""Executions finished at given times for the dashboard's tests
(``tests/console/test_dashboard.py``, ``test_dashboard_browser.py``): ``finish`` at a
time, and ``failures_then_a_burst`` (failures half an hour ago, an old one, then a burst of
newer successes) for the "failed, last hour" card, which must count what its link lists.

Everything goes through the store with explicit times; no row is written directly.

why: D93 (the dashboard's counts are index ranges, checked against real rows)
"""

from __future__ import annotations

from datetime import timedelta

from executions import store
from executions.events import ExecutionFailure, Finished, Ok
from tests.support.helpers import T0, block_on_child, create, create_workflow, lock


def finish(execution_id: str, retval, at) -> None:
    locked = lock(execution_id, now=at - timedelta(seconds=1))
    store.append(execution_id, None, Finished(retval=retval), fence=locked.fence, now=at)


def failures_then_a_burst(burst: int, now=T0) -> list[str]:
    """Three failures 35 minutes before ``now`` (one of them a workflow's child), an old
    failure two hours before, then ``burst`` newer executions that finished ok."""
    failed = []
    for kind in ("uncategorized", "timed_out"):
        execution_id = create(now=now - timedelta(minutes=36))
        finish(execution_id, ExecutionFailure(kind, "boom"), now - timedelta(minutes=35))
        failed.append(execution_id)
    workflow = create_workflow(now=now - timedelta(minutes=37))
    locked = lock(workflow, now=now - timedelta(minutes=37))
    _, child, _ = block_on_child(workflow, locked, now=now - timedelta(minutes=37))
    finish(child, ExecutionFailure("uncategorized", "child boom"), now - timedelta(minutes=35))
    failed.append(child)
    old = create(now=now - timedelta(hours=3))
    finish(old, ExecutionFailure("uncategorized", "old"), now - timedelta(hours=2))
    for i in range(burst):
        execution_id = create(now=now - timedelta(minutes=30) + timedelta(seconds=i))
        finish(execution_id, Ok(i), now - timedelta(minutes=20) + timedelta(seconds=i))
    return failed
