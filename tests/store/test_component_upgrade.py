"""An execution moves to another component only by ``upgrade_execution_component`` (spec 000
§7.4, §6.5 H): one ``ComponentUpgradeFinished`` at the version its dry run replayed, never
onto a history it did not see, never under a running worker, and nothing written when refused.
"""

from __future__ import annotations

import pytest

from executions import errors, store
from executions.events import ComponentId, Ok
from executions.ids import content_digest
from tests.support.helpers import (
    ACTIVITY,
    DEPLOYMENT,
    WORKFLOW,
    create,
    create_workflow,
    db_snapshot,
    event_variants,
    lock,
)

pytestmark = pytest.mark.django_db(transaction=True)

NEW = ComponentId(component_type="workflow", name="test_workflows", component_digest=content_digest(b"workflows v2"))
NEW_DEPLOYMENT = "Dep_01JBBBBBBBBBBBBBBBBBBBBBBB"


def upgrade(execution_id: str, **overrides) -> int:
    arguments = {
        "old_digest": WORKFLOW.component_digest,
        "new_digest": NEW.component_digest,
        "deployment_id": NEW_DEPLOYMENT,
        "version": store.get_state(execution_id).next_version,
    } | overrides
    return store.upgrade_execution_component(execution_id, **arguments)


def test_an_upgrade_pins_the_execution_to_the_new_component_and_deployment():
    execution_id = create_workflow()
    before = store.get_state(execution_id)
    assert upgrade(execution_id) == before.next_version + 1
    after = store.get_state(execution_id)
    assert after.component_id_input_digest == NEW.component_digest
    assert after.deployment_id == NEW_DEPLOYMENT
    assert after.state == before.state and after.incompatible_digest is None
    assert event_variants(execution_id)[-1] == "component_upgrade_finished"
    event = store.get_event(execution_id, before.next_version)
    assert event.event.outcome == {"type": "success", "reason": {"type": "manual", "force": False}}


@pytest.mark.parametrize(
    "case, expected",
    [
        ("another digest", errors.NotFound),
        ("stale version", errors.VersionConflict),
        ("running", errors.IllegalState),
        ("finished", errors.AlreadyFinished),
    ],
)
def test_a_refused_upgrade_writes_nothing(case, expected):
    execution_id = create_workflow()
    overrides = {}
    if case == "another digest":
        overrides["old_digest"] = ACTIVITY.component_digest
    elif case == "stale version":
        overrides["version"] = store.get_state(execution_id).next_version - 1
    elif case == "running":
        lock(execution_id)
    elif case == "finished":
        locked = lock(execution_id)
        store.append(execution_id, locked.next_version, _finished(), fence=locked.fence)
    snapshot = db_snapshot()
    with pytest.raises(expected):
        upgrade(execution_id, **overrides)
    assert db_snapshot() == snapshot


def test_an_activity_can_be_upgraded_too():
    """An activity has no history to replay: moving it is always safe."""
    execution_id = create()
    upgrade(execution_id, old_digest=ACTIVITY.component_digest)
    assert store.get_state(execution_id).component_id_input_digest == NEW.component_digest
    assert store.get_state(execution_id).deployment_id == NEW_DEPLOYMENT != DEPLOYMENT


def _finished():
    from executions.events import Finished

    return Finished(retval=Ok(value=None))
