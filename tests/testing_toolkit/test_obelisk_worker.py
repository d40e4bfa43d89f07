"""The ``obelisk_worker`` fixture (issue 41): a real worker cluster on the test's database,
started before the test and stopped after it, for end-to-end tests of the same workflows
``run_workflow`` runs in-process. A real cluster cannot skip time: the workflow's sleep is a
second here. why: D120
"""

from __future__ import annotations

import pytest

from executions.events import Ok
from tests.support import toolkit_components as c

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.obelisk_worker(modules=["tests.support.toolkit_components"]),
]


def test_the_worker_fixture_runs_a_workflow_end_to_end(obelisk_worker):
    retval = obelisk_worker.run(c.five_steps_and_an_hour, 1, 1.0, timeout=60)
    assert isinstance(retval, Ok) and retval.value["n"] == 6
    assert "worker cluster:" in obelisk_worker.log()


def test_a_real_activity_on_the_worker_answers_current_activity(obelisk_worker):
    """What ``run_workflow`` shows in-process (``test_run_workflow``), a worker does too.
    (Not both at once: a cluster on the test database would claim the in-process run's
    executions.)"""
    retval = obelisk_worker.run(c.asks_who, timeout=60)
    assert retval.value["label"] == "me" and retval.value["attempt"] == 1
    parent, _, child = retval.value["execution_id"].partition(".")
    assert parent.startswith("E_") and child  # the activity's own id: a child of the workflow
