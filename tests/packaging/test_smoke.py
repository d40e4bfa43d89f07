import pytest

from executions import store
from executions.events import Finished, Ok
from tests.support import helpers

pytestmark = pytest.mark.django_db


def test_create_lock_finish_roundtrip():
    execution_id = helpers.create(params=[1, "a"])
    locked = helpers.lock(execution_id)
    assert locked.params == [1, "a"]
    assert store.append(execution_id, locked.next_version, Finished(retval=Ok(42)), fence=locked.fence) == 2
    assert store.get_finished_result(execution_id) == Ok(42)
    assert helpers.event_variants(execution_id) == ["created", "locked", "finished"]
