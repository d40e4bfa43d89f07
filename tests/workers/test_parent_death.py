"""A cluster whose main process is killed hands back its workflows too (issue 36 item 7, D96).

The OOM killer ends the ``obelisk_worker`` process with ``SIGKILL``, and only it. Its
sentinel, pusher, monitor and workers must notice and end, and hand back what they held
(``tests/workers/test_worker_reliability.py`` checks this for activities). Here a workflow with
children is in the middle of its run, in a thread of a worker process, when the main
process is killed: the workflow and its running children are handed back, nothing is
claimed after the kill, and a second cluster finishes the workflow with the result of an
undisturbed run, no retry used by any of them.

Real ``manage.py obelisk_worker`` clusters (``tests/support/clusters.py``) run the
workflows and activities of ``tests/support/workflow_components.py``; timeouts are safety limits.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from django.utils import timezone

import tests.support.workflow_components as wfc
from executions import store
from executions.events import Locked, Ok, TemporarilyFailed, TemporarilyTimedOut
from executions.models import ExecutionState
from executions.state_machine import State
from tests.support.clusters import outcomes, started_clusters, wait_until
from workers.testing import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

MODULES = "tests.support.components,tests.support.workflow_components"
WAIT = 90  # seconds: safety limit for a workflow to finish
STOP_LIMIT = 45  # seconds: safety limit for the killed cluster's processes to end
SECONDS = [1.5] * 6  # the children's run times: both workers are mid-run at the kill


@pytest.fixture
def clusters(django_db_setup, request, tmp_path):
    """``start(workers)``: clusters of this test's own serving ``tests.support.workflow_components``."""
    with started_clusters(
        request, tmp_path, default_workers=2, default_env={"OBELISK_COMPONENT_MODULES": MODULES}
    ) as start:
        yield start


def started_children(marker: Path) -> set[int]:
    """The pids of the processes that started a child (``test:wfp/acts.work`` notes
    ``<execution id> <attempt> <pid> <index>``)."""
    try:
        return {int(line.split()[2]) for line in marker.read_text().splitlines()}
    except FileNotFoundError:
        return set()


def family(parent: str) -> list[str]:
    children = ExecutionState.objects.filter(execution_id__startswith=f"{parent}.")
    return [parent, *children.values_list("execution_id", flat=True)]


@pytest.mark.parametrize("workflow", ["test:wfp/wf.crash-await", "test:wfp/wf.crash-interrupt"])
def test_a_killed_main_process_hands_back_its_workflow_and_children(clusters, tmp_path, workflow):
    """Killed while both workers run a child: every process of the cluster ends, nothing of
    the family is left locked or claimed after the kill, and a second cluster finishes the
    workflow with the undisturbed result; no execution used a retry."""
    marker = tmp_path / "work.marks"
    first = clusters(2)
    parent, _ = submit(workflow, [str(marker), SECONDS])
    wait_until(lambda: len(started_children(marker)) == 2, timeout=WAIT, what="a child to run in each worker")

    killed_at = timezone.now()
    first.signal_main(signal.SIGKILL)
    first.process.wait(STOP_LIMIT)
    wait_until(lambda: not first.group_alive(), timeout=STOP_LIMIT, what="every process of the killed cluster to end")

    executions = family(parent)
    assert len(executions) > 1, "the kill came before the workflow created its children"
    still_locked = [e for e in executions if store.get_state(e).state == State.LOCKED]
    assert still_locked == [], "held by the killed cluster, not handed back"
    late_locks = [
        (execution_id, record.created_at)
        for execution_id in executions
        for record in store.get(execution_id).events
        if isinstance(record.event, Locked) and record.created_at > killed_at
    ]
    assert late_locks == [], f"claimed after the kill (at {killed_at})"
    assert not store.get_state(parent).is_finished, "the kill came too late to interrupt the workflow"

    clusters(2)
    assert outcomes([parent], WAIT) == {parent: Ok(wfc.expected_crash_result(SECONDS))}
    retried = {
        execution_id: [r.event.VARIANT for r in store.get(execution_id).events]
        for execution_id in family(parent)
        if any(isinstance(r.event, (TemporarilyFailed, TemporarilyTimedOut)) for r in store.get(execution_id).events)
    }
    assert retried == {}, "a retry was used"
