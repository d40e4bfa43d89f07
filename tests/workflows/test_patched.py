"""``patched(change_id)`` carries a workflow's old and new code paths through an upgrade (D112).

No database: ``tests.support.replay_fakes.FakeStore`` stands in for the store. A history
recorded before the change replays the old path (False, nothing consumed or written); a run
that reaches the change past its history writes the marker and takes the new path (True),
and every later replay of that history takes it again; a run keeps its first answer.
"""

from __future__ import annotations

import pytest

from executions.events import Persist
from tests.support.replay_fakes import AWAIT_0, FN1, FakeStore, start_run, written
from workers.replay import NondeterminismDetected

MARKER = {"type": "patch", "change_id": "sleep-first"}


def markers(store: FakeStore, execution_id: str) -> list[dict]:
    return [e.kind for _, e in store.history(execution_id) if isinstance(e, Persist)]


def test_a_new_execution_takes_the_new_path_and_records_it():
    store = FakeStore()
    execution_id = store.top_level()
    run = start_run(store, execution_id, AWAIT_0, world=True)
    assert run.history.patched("sleep-first") is True
    assert run.history.call(FN1, [2]) == 4
    run.history.finalize()
    assert markers(store, execution_id) == [MARKER]
    replay = start_run(store, execution_id, AWAIT_0, world=True)
    assert replay.history.patched("sleep-first") is True  # the marker replays
    assert replay.history.call(FN1, [2]) == 4
    replay.history.finalize()
    assert written(replay) == []


def test_a_history_recorded_before_the_patch_replays_the_old_path():
    store = FakeStore()
    execution_id = store.top_level()
    old = start_run(store, execution_id, AWAIT_0, world=True)
    assert old.history.call(FN1, [2]) == 4  # the code before the change: no patched() call
    old.history.finalize()
    recorded = store.history(execution_id)
    new = start_run(store, execution_id, AWAIT_0, world=True)
    assert new.history.patched("sleep-first") is False
    assert new.history.patched("sleep-first") is False  # the run keeps its answer
    assert new.history.call(FN1, [2]) == 4  # the old path replays cleanly
    new.history.finalize()
    assert written(new) == [] and store.history(execution_id) == recorded


def test_the_new_path_on_an_old_history_is_nondeterminism():
    """What ``patched`` is for: without it, the changed code meets the old history."""
    store = FakeStore()
    execution_id = store.top_level()
    old = start_run(store, execution_id, AWAIT_0, world=True)
    old.history.call(FN1, [2])
    old.history.finalize()
    changed = start_run(store, execution_id, AWAIT_0, world=True)
    with pytest.raises(NondeterminismDetected):
        changed.history.call(FN1, [3])


def test_an_old_history_that_ends_before_the_change_takes_the_new_path():
    """Past the recorded history the change is new code: the marker is written there."""
    store = FakeStore()
    execution_id = store.top_level()
    old = start_run(store, execution_id, AWAIT_0, world=True)
    old.history.call(FN1, [2])
    old.history.finalize()
    new = start_run(store, execution_id, AWAIT_0, world=True)
    assert new.history.call(FN1, [2]) == 4
    assert new.history.patched("after-the-call") is True
    new.history.finalize()
    assert markers(store, execution_id) == [{"type": "patch", "change_id": "after-the-call"}]
