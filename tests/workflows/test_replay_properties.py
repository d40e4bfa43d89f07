"""Replay determinism as properties (hypothesis) of the pure replay core: a recorded run
replays without writes and with identical results, Interrupt and Await give the same
results, a changed call sequence is reported as nondeterminism, and calls added after the
recorded ones extend the history.

No database: ``tests.support.replay_fakes.FakeStore`` stands in for the execution store
(versions fenced, children created with their requests, responses delivered per parent by
``seq``) and ``World`` makes children finish and delays fire on demand. The same scenarios
run against the real store in ``tests/workflows/test_replay_in_store_*.py``.

why: D36, D37, D60
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import event as note_case
from hypothesis import strategies as st

from executions.events import (
    Ok,
    Persist,
)
from tests.support.replay_fakes import (
    AWAIT_0,
    FN1,
    FN2,
    INTERRUPT,
    FakeExecution,
    FakeStore,
    Run,
    Strategy,
    World,
    start_run,
)
from workers.replay import (
    EventHistory,
    NondeterminismDetected,
    WorkflowError,
    WorkflowInterrupt,
)

# ---------------------------------------------------------------------------------------------
# Properties: replay determinism (hypothesis)
# ---------------------------------------------------------------------------------------------

# A program is a list of operations; ``j``/``k`` index the join sets created and the children
# submitted so far; an operation on one that does not exist (or is closed) is skipped, so every
# program runs. ``fn1`` children are activities, ``fn2`` children workflows.
FUNCTIONS = [FN1, FN2]
_index = st.sampled_from([0, 0, 0, 1, 1, 2])
OPERATIONS = st.one_of(
    st.tuples(st.just("create")),
    st.tuples(st.just("named"), st.sampled_from(["a", "b_1", "c/d"])),
    st.tuples(st.just("submit"), _index, st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("delay"), _index, st.integers(1, 5)),
    st.tuples(st.just("join_next"), _index),
    st.tuples(st.just("await_next"), _index, st.integers(0, 1)),
    st.tuples(st.just("try"), _index),
    st.tuples(st.just("get"), st.integers(0, 1), _index),
    st.tuples(st.just("close"), _index),
    st.tuples(st.just("u64"), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("string"), st.integers(0, 3), st.integers(0, 3)),
    st.tuples(st.just("now")),
    st.tuples(st.just("call"), st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("sleep"), st.integers(1, 5)),
    st.tuples(st.just("schedule"), st.integers(0, 1), st.integers(0, 9)),
    st.tuples(st.just("stub"), _index, st.integers(0, 2)),
)
PROGRAMS = st.lists(OPERATIONS, max_size=20).map(lambda program: [("create",), *program])


class Interpreter:
    """Runs a program against one ``EventHistory`` and records what every operation returned
    (catchable errors included) and how many events it processed."""

    def __init__(self, history: EventHistory):
        self.history = history
        self.join_sets: list[Any] = []
        self.closed: set[str] = set()
        self.children: list[tuple[Any, str]] = []
        self.results: list[Any] = []
        self.processed: list[int] = []

    def run(self, program: list[tuple]) -> list[Any]:
        for operation in program:
            before = self.history.position
            try:
                self.results.append(self.apply(*operation))
            except WorkflowError as error:
                self.results.append((type(error).__name__, str(error)))
            self.processed.append(self.history.position - before)
        self.history.finalize()
        return self.results

    def _open(self, j: int):
        if j < len(self.join_sets) and str(self.join_sets[j]) not in self.closed:
            return self.join_sets[j]
        return None

    def apply(self, name: str, *args) -> Any:  # noqa: C901 - one branch per operation
        h = self.history
        if name in ("create", "named"):
            join_set = h.create_join_set(*args)
            self.join_sets.append(join_set)
            return str(join_set)
        if name in ("u64", "string"):
            low, width = args
            return h.random_u64(low, low + width + 1) if name == "u64" else h.random_string(low, low + width + 1)
        if name == "now":
            return h.now().isoformat()
        if name == "call":
            return h.call(FUNCTIONS[args[0]], [args[1]], component_type=("activity", "workflow")[args[0]])
        if name == "sleep":
            return h.sleep(timedelta(seconds=args[0])).isoformat()
        if name == "schedule":
            return str(h.schedule(FUNCTIONS[args[0]], [args[1]]))
        if name in ("get", "stub"):
            k = args[0] if name == "stub" else args[1]
            if k >= len(self.children):
                return "skipped"
            child, ffqn = self.children[k]
            if name == "stub":
                return h.stub(ffqn, child, Ok(args[1]))
            return h.get(FUNCTIONS[args[0]], child)
        join_set = self._open(args[0])
        if join_set is None:
            return "skipped"
        if name == "submit":
            ffqn = FUNCTIONS[args[1]]
            child = h.submit(join_set, ffqn, [args[2]], component_type=("activity", "workflow")[args[1]])
            self.children.append((child, ffqn))
            return str(child)
        if name == "delay":
            return str(h.submit_delay(join_set, timedelta(seconds=args[1])))
        if name == "join_next":
            response_id, ok = h.join_next(join_set)
            return str(response_id), ok
        if name == "await_next":
            child, retval = h.await_next(join_set, FUNCTIONS[args[1]])
            return str(child), retval
        if name == "try":
            found = h.try_join_next(join_set)
            return found and (str(found[0]), found[1])
        assert name == "close"
        self.closed.add(str(join_set))
        return h.close_join_set(join_set)


def record_with_await(program, batch: int = 0, execution_id: str | None = None) -> tuple[FakeStore, str, Interpreter]:
    """The first run under Await, the world answering whenever the workflow waits."""
    store = FakeStore()
    execution_id = execution_id or store.top_level()
    store.executions.setdefault(execution_id, FakeExecution(FN1, [], None, "workflow"))
    interpreter = Interpreter(start_run(store, execution_id, Strategy(True, batch), world=True).history)
    interpreter.run(program)
    return store, execution_id, interpreter


def record_with_interrupts(program, execution_id: str, batch: int = 0) -> tuple[FakeStore, Interpreter]:
    """Interrupt strategy: run until the program completes; after each interrupt deliver the
    responses already produced, or else let the world take one step, and run again."""
    store = FakeStore()
    store.executions[execution_id] = FakeExecution(FN1, [], None, "workflow")
    for _ in range(200):
        known = len(store.responses(execution_id))
        interpreter = Interpreter(start_run(store, execution_id, Strategy(False, batch)).history)
        try:
            interpreter.run(program)
            return store, interpreter
        except WorkflowInterrupt:
            if len(store.responses(execution_id)) == known:
                assert World(store).step(execution_id), "interrupted with nothing left to wait for"
    raise AssertionError("the program did not complete")


def replay(store: FakeStore, execution_id: str, program) -> tuple[Run, Interpreter]:
    run = start_run(store, execution_id, INTERRUPT)
    interpreter = Interpreter(run.history)
    interpreter.run(program)
    return run, interpreter


def trace(store: FakeStore, execution_id: str) -> list[dict]:
    """The recorded history without the one field that depends on the strategy."""
    return [event.model_dump(mode="json", exclude={"run_expires_at"}) for _, event in store.history(execution_id)]


PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@PROPERTY_SETTINGS
@given(program=PROGRAMS, batch=st.sampled_from([0, 1, 3, 100]))
def test_a_recorded_run_replays_without_writes_and_with_identical_results(program, batch):
    """§7 inv. 1-2: replaying a completed run against its history writes nothing, creates
    nothing, and every operation returns what it returned the first time."""
    store, execution_id, first = record_with_await(program, batch)
    events_before = store.history(execution_id)
    run, again = replay(store, execution_id, program)
    assert again.results == first.results
    assert run.writer.appends == [] and run.writer.stubs == []
    assert store.history(execution_id) == events_before


@PROPERTY_SETTINGS
@given(program=PROGRAMS, batch=st.sampled_from([0, 1, 3, 100]))
def test_interrupt_and_await_give_the_same_results(program, batch):
    """Decision 10: a workflow run under Interrupt (re-run after every wait) and under Await
    (waiting in the same run) sees the same values and records the same history, whether
    each buffers its writes or not (D60)."""
    store, execution_id, awaited = record_with_await(program, batch)
    for interrupt_batch in (0, batch):
        interrupted_store, interrupted = record_with_interrupts(program, execution_id, interrupt_batch)
        assert interrupted.results == awaited.results
        assert trace(interrupted_store, execution_id) == trace(store, execution_id)


def _recorded_positions(interpreter: Interpreter) -> list[int]:
    return [i for i, count in enumerate(interpreter.processed) if count > 0]


def _changed_arguments(operation: tuple) -> tuple | None:
    """The operation with a value-level argument changed (not which join set it uses)."""
    name, *args = operation
    if name in ("submit", "call", "schedule"):
        return (name, *args[:-1], args[-1] + 1)
    if name in ("delay", "sleep", "u64", "string", "stub"):
        return (name, *args[:-1], args[-1] + 1)
    if name == "await_next":
        return (name, args[0], 1 - args[1])
    if name == "named":
        return (name, args[0] + "x")
    return None


@PROPERTY_SETTINGS
@given(program=PROGRAMS, data=st.data())
def test_a_changed_call_sequence_is_nondeterminism(program, data):
    """§3.4/§3.7: replay a recorded history with the program changed (a recorded call removed,
    its arguments changed, two different recorded calls swapped, or a call inserted before a
    recorded one). The oracle is the changed program's own fresh recording: when the recorded
    history is not a prefix of it, the replay reports nondeterminism (at a call or in
    ``finalize``); when it is (the change had no effect on what is recorded), it does not."""
    store, execution_id, first = record_with_await(program)
    positions = _recorded_positions(first)
    mutations = ["remove", "insert"]
    changeable = [i for i in positions if _changed_arguments(program[i])]
    swappable = [i for i in positions if i + 1 in positions and program[i] != program[i + 1]]
    mutations += ["change"] * bool(changeable) + ["swap"] * bool(swappable)
    if not positions:
        return
    mutation = data.draw(st.sampled_from(mutations), label="mutation")
    mutated = list(program)
    if mutation == "remove":
        del mutated[data.draw(st.sampled_from(positions), label="position")]
    elif mutation == "insert":
        i = data.draw(st.sampled_from(positions), label="position")
        first_event = store.history(execution_id)[sum(first.processed[:i])][1]
        mutated.insert(i, ("create",) if isinstance(first_event, Persist) else ("now",))
    elif mutation == "change":
        i = data.draw(st.sampled_from(changeable), label="position")
        mutated[i] = _changed_arguments(program[i])
    else:
        i = data.draw(st.sampled_from(swappable), label="position")
        mutated[i], mutated[i + 1] = mutated[i + 1], mutated[i]
    recorded = trace(store, execution_id)
    fresh_store, _, _ = record_with_await(mutated, execution_id=execution_id)
    if trace(fresh_store, execution_id)[: len(recorded)] != recorded:
        note_case("history differs")
        with pytest.raises(NondeterminismDetected):
            replay(store, execution_id, mutated)
    else:
        note_case("history is a prefix")
        try:
            replay(store, execution_id, mutated)
        except WorkflowInterrupt:
            pass  # the changed program goes on past the history and waits: not nondeterminism


@PROPERTY_SETTINGS
@given(program=PROGRAMS, extra=PROGRAMS)
def test_calls_added_after_the_recorded_ones_extend_the_history(program, extra):
    """§7 inv. 1: code that makes more calls after the recorded ones is not nondeterminism:
    the recorded prefix replays and only the new calls write."""
    store, execution_id, first = record_with_await(program)
    recorded = store.history(execution_id)
    assume(len(recorded) == sum(first.processed))  # finalize closed nothing: the calls were the last events
    run = start_run(store, execution_id, AWAIT_0, world=True)
    interpreter = Interpreter(run.history)
    interpreter.run(program + extra)
    assert interpreter.results[: len(program)] == first.results
    assert store.history(execution_id)[: len(recorded)] == recorded
    assert all(version > len(recorded) for version, _, _ in run.writer.appends)
