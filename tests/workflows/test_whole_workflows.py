"""Whole ``@workflow`` functions (``tests/support/workflows.py``) through ``run_workflow``
and the real store, under both blocking strategies (issue 12, items 1, 4 and 5).

- Interrupt and Await give the same results; children are created once, replays write
  nothing; durable time and randomness replay identically; a trap closes its join sets.
- Code changed between runs is reported as nondeterminism, history and code side by side.
- The determinism guard fails a workflow that reaches the clock or randomness, naming the
  ``ctx`` call to use; activities of the same module use them freely.
- Decision 9 through the store; logs and backtraces captured, a replay marking repeats.

why: D34, D36, D40, D41, D99
"""

from __future__ import annotations

import sys
import types
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from executions import store
from executions.events import (
    ExecutionFailure,
    Finished,
    JoinNext,
    Ok,
    Persist,
)
from executions.ids import ExecutionId
from tests.support import workflows
from tests.support.workflow_runs import (
    AWAIT_0,
    FN1,
    World,
    assert_versions_contiguous,
    children_of,
    complete,
    create_root,
    events,
    finish_child,
    history_events,
    new_driven,
    result,
    run_root,
    start_run,
)
from workers import registry
from workers.replay import WorkflowInterrupt

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_a_workflow_completes_with_each_child_created_once_and_replays_write_nothing(blocking):
    """Decision 10: Interrupt (a new run after every wait, each replaying the history) and
    Await (waiting in place) give the same result; every child is created once, every
    history event written once (each later run's history starts with the earlier one's),
    versions stay contiguous."""
    spec = workflows.fan_out
    execution_id = create_root(spec, [1, 2, 3])
    world = World(execution_id)
    snapshots = []
    for _ in range(40):
        run_root(execution_id, spec, world, blocking=blocking)
        snapshots.append(history_events(execution_id))
        if store.get_state(execution_id).is_finished:
            break
        world.settle()
    for earlier, later in zip(snapshots, snapshots[1:], strict=False):
        assert later[: len(earlier)] == earlier
    value = result(execution_id).value
    assert value["values"] == [1, 2, 3] and value["doubled"] == 12
    assert len(children_of(execution_id)) == 4
    assert sorted(world.activity_runs) == children_of(execution_id)
    kinds = [type(e).__name__ for _, e in history_events(execution_id)]
    assert kinds.count("JoinSetRequest") == 5  # three children, the sleep, the direct call
    if blocking == "interrupt":
        assert len(snapshots) > 2
    assert_versions_contiguous(execution_id)


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_random_values_uuid_and_now_are_identical_on_replay(blocking):
    """Decision 4: ``ctx.random_u64``, ``ctx.random_string``, ``ctx.uuid`` and ``ctx.now``
    are recorded on the first run; every run (a replay under Interrupt) computes the same
    values, and the result holds them."""
    workflows.DRAWS.clear()
    spec = workflows.draws
    execution_id = create_root(spec)
    runs = complete(execution_id, spec, World(execution_id), blocking=blocking)
    value = result(execution_id).value
    first = {k: value[k] for k in ("u64", "string", "uuid", "now")}
    assert all({k: d[k] for k in first} == first for d in workflows.DRAWS)
    assert len(workflows.DRAWS) == runs + 1
    persisted = [e for _, e in history_events(execution_id) if isinstance(e, Persist)]
    assert [p.kind["type"] for p in persisted] == ["random_u64", "random_string", "random_u64", "random_u64", "now"] + [
        "random_u64"
    ]
    assert int.from_bytes(bytes(persisted[0].value), "big") == value["u64"]
    assert bytes(persisted[1].value).decode() == value["string"]
    assert bytes(persisted[4].value).decode() == value["now"]
    assert value["uuid"][14] == "4"
    other = create_root(spec)
    complete(other, spec, World(other), blocking=blocking)
    assert result(other).value["u64"] != value["u64"]


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
@pytest.mark.parametrize("use_with", [False, True], ids=["finalize", "with_block"])
def test_a_trap_closes_its_join_sets(blocking, use_with):
    """Decision 3: workflow code that raises still closes its join sets (at the end of its
    ``with`` block, or in ``finalize``): the unawaited activity is cancelled, the delay
    answered as cancelled, the child workflow awaited (and not cancelled); then the
    execution finishes with the trap."""
    spec = workflows.trap
    execution_id = create_root(spec, use_with)
    world = World(execution_id)
    complete(execution_id, spec, world, blocking=blocking)
    failure = result(execution_id)
    assert failure.kind == "uncategorized"
    assert failure.reason == "workflow trap: RuntimeError: bug in the workflow"
    assert "RuntimeError: bug in the workflow" in failure.detail
    hang, child = children_of(execution_id)[0], children_of(execution_id)[1]
    assert result(hang).kind == "cancelled"
    assert result(child) == Ok(5)
    assert store.get_state(child).lifecycle == "active"
    closing = [e for _, e in history_events(execution_id) if isinstance(e, JoinNext) and e.closing]
    assert len(closing) == (2 if use_with else 3)
    delays = [r.delay_success for r in store.get(execution_id).responses if r.delay_id]
    assert delays == ([] if use_with else [False])
    assert_versions_contiguous(execution_id)


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_child_errors_reach_the_parent_as_child_failed_with_typed_retvals(blocking):
    """§5.5: an error value, a crash, a timeout, a cancellation and a child workflow's trap
    each reach the parent as ``ChildFailed`` whose ``retval`` is the ``Err`` or the
    ``ExecutionFailure`` of that kind (not a crash of the parent); ``invoke`` returns it,
    ``join_next`` reports it as not ok, ``get`` reads it; an ok value is decoded with the
    child's return type."""
    spec = workflows.child_outcomes
    execution_id = create_root(spec)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    value = result(execution_id).value
    child = {label: item[-1] for label, item in value.items() if isinstance(item, list) and len(item) == 3}
    assert value["error_value"] == ["Err", {"code": "E42"}, child["error_value"]]
    assert value["crashed"][:2] == ["ExecutionFailure", "uncategorized"]
    assert value["timed_out"][:2] == ["ExecutionFailure", "timed_out"]
    assert value["cancelled"][:2] == ["ExecutionFailure", "cancelled"]
    assert value["child_workflow_trap"][:2] == ["ExecutionFailure", "uncategorized"]
    assert value["invoked"] == ["Err", {"code": "E7"}]
    assert value["typed_ok"] == ["tuple", [3, "3"]]
    assert value["join_next"][1] is False and value["get"] == ["Err", 3]
    assert result(child["timed_out"]).kind == "timed_out"
    assert result(child["child_workflow_trap"]).reason == "workflow trap: ValueError: child trap 5"
    assert_versions_contiguous(execution_id)


# ---------------------------------------------------------------------------------------------
# Item 4: code changed between runs is reported as nondeterminism, side by side
# ---------------------------------------------------------------------------------------------


def _record_with_version_a(case: str, monkeypatch, runs: int = 1) -> str:
    monkeypatch.setattr(workflows, "CODE_VERSION", "A")
    spec = workflows.changing
    execution_id = create_root(spec, case)
    world = World(execution_id)
    for _ in range(runs):
        run_root(execution_id, spec)
        assert store.get_state(execution_id).state == "blocked_by_join_set"
        world.settle()
    return execution_id


def _replay_with_version_b(execution_id: str, monkeypatch) -> ExecutionFailure:
    monkeypatch.setattr(workflows, "CODE_VERSION", "B")
    recorded = history_events(execution_id)
    run_root(execution_id, workflows.changing)
    assert history_events(execution_id) == recorded  # nothing written but the failure
    assert isinstance(events(execution_id)[-1], Finished)
    assert_versions_contiguous(execution_id)
    failure = result(execution_id)
    assert failure.kind == "nondeterminism_detected" and failure.reason is None
    return failure


NONDETERMINISM_CASES = {
    # case: (runs under version A, lines the detail must hold, with {E} the execution id)
    "call_order": (
        1,
        [
            "key does not match event stored at version 3: key: ChildExecutionRequest({E}.g:1_1, test:wf/acts.fn2, "
            "params: [3]), event: JoinSetRequest(ChildExecutionRequest({E}.g:1_1, test:wf/acts.fn1, params: [2]))",
            "  position: event 2 of 4 in the history, version 3",
            "  join set: history `g:1`, code `g:1`",
            "  id: history `{E}.g:1_1`, code `{E}.g:1_1`",
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn2`  (differs)",
            "  arguments: history `[2]`, code `[3]`  (differs)",
        ],
    ),
    "arguments": (
        1,
        [
            "key does not match event stored at version 3: key: ChildExecutionRequest({E}.o:1-fn1_1, "
            "test:wf/acts.fn1, params: [4]), event: JoinSetRequest(ChildExecutionRequest({E}.o:1-fn1_1, "
            "test:wf/acts.fn1, params: [2]))",
            "  position: event 2 of 3 in the history, version 3",
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn1`",
            "  arguments: history `[2]`, code `[4]`  (differs)",
        ],
    ),
    "removed_call": (
        1,
        [
            "key does not match event stored at version 2: key: CreateJoinSet(o:1-fn1), event: Persist",
            "  position: event 1 of 4 in the history, version 2",
            "  join set: history `—`, code `o:1-fn1`  (differs)",
            "  persist kind: history `Now`, code `—`  (differs)",
        ],
    ),
    "removed_trailing_call": (2, ["found unprocessed request stored at version 6: event: JoinSetCreate(o:2-fn2)"]),
    "added_call_before": (
        1,
        [
            "key does not match event stored at version 2: key: Persist(RandomU64(0, 9)), "
            "event: JoinSetCreate(o:1-fn1)",
            "  position: event 1 of 3 in the history, version 2",
            "  persist kind: history `—`, code `RandomU64(0, 9)`  (differs)",
            "  join set: history `o:1-fn1`, code `—`  (differs)",
        ],
    ),
    "join_set_name": (
        1,
        [
            "key does not match event stored at version 2: key: CreateJoinSet(n:beta), event: JoinSetCreate(n:alpha)",
            "  position: event 1 of 3 in the history, version 2",
            "  join set: history `n:alpha`, code `n:beta`  (differs)",
        ],
    ),
    "await_function": (
        1,
        [
            "key does not match event stored at version 4: key: JoinNextChild(g:1, AwaitNext, test:wf/acts.fn2), "
            "event: JoinNext(g:1)",
            "  position: event 3 of 3 in the history, version 4",
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn2`  (differs)",
        ],
    ),
    "sleep_duration": (
        1,
        [
            "key does not match event stored at version 3: key: DelayRequest(Delay_{U}.o:1-sleep_1, "
            "In(0:00:02)), event: JoinSetRequest(DelayRequest(Delay_{U}.o:1-sleep_1, expires_at: ",
            "  schedule at: history `In(0:00:01)`, code `In(0:00:02)`  (differs)",
        ],
    ),
    "scheduled_function": (
        1,
        [
            "  function: history `test:wf/acts.fn1`, code `test:wf/acts.fn2`  (differs)",
            "  arguments: history `[2]`, code `[2]`",
            "  position: event 1 of 4 in the history, version 2",
        ],
    ),
}


@pytest.mark.parametrize("case", list(NONDETERMINISM_CASES))
def test_changed_code_finishes_with_nondeterminism_showing_history_and_code_side_by_side(case, monkeypatch):
    """Item 4 (§3.7): the workflow's code changed between runs (another call order, other
    arguments, a removed call, a call added before the recorded ones, another join set,
    another awaited function, another delay, another scheduled function). The next run
    replays with the new code and finishes the execution with ``execution_failure
    nondeterminism_detected``, writing no history event; the failure's detail shows what the
    history holds next to what the code asked for: function, arguments, join set, position
    and version."""
    runs, expected = NONDETERMINISM_CASES[case]
    execution_id = _record_with_version_a(case, monkeypatch, runs)
    failure = _replay_with_version_b(execution_id, monkeypatch)
    detail = failure.detail
    for line in expected:
        line = line.replace("{E}", execution_id).replace("{U}", execution_id[2:])
        assert line in detail, f"{line!r} not in\n{detail}"


def test_changed_code_in_a_child_reaches_the_parent_as_a_nondeterminism_failure(monkeypatch):
    """§3.7 step 4: a derived execution that fails with nondeterminism responds to its parent
    like any failure: the parent sees ``ChildFailed`` with that kind (here: the workflow
    ``changing`` as a child, its code changed while it waited)."""
    monkeypatch.setattr(workflows, "CODE_VERSION", "A")
    spec = workflows.driven
    parent = create_root(spec)
    run = start_run(parent)
    join_set = run.history.create_join_set()
    child = str(run.history.submit(join_set, workflows.changing.ffqn, ["arguments"], component_type="workflow"))
    with pytest.raises(WorkflowInterrupt):
        run.history.join_next(join_set)
    world = World(parent, actions={workflows.changing.ffqn: "hold"})  # the test runs the child
    run_root(child, workflows.changing)  # records version A, waits for its activity
    world.settle()
    monkeypatch.setattr(workflows, "CODE_VERSION", "B")
    run_root(child, workflows.changing)
    assert result(child).kind == "nondeterminism_detected"
    run = start_run(parent)
    run.history.create_join_set()
    run.history.submit(join_set, workflows.changing.ffqn, ["arguments"], component_type="workflow")
    assert run.history.join_next(join_set) == (ExecutionId.parse(child), False)
    assert run.history.get(workflows.changing.ffqn, child).kind == "nondeterminism_detected"
    run.end()


# ---------------------------------------------------------------------------------------------
# Item 5: the determinism guard
# ---------------------------------------------------------------------------------------------

FORBIDDEN = {
    "time.time": ("time.time()", "ctx.now()"),
    "time.monotonic": ("time.monotonic()", "ctx.now()"),
    "random.random": ("random.random()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "random.randint": ("random.randint()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "uuid.uuid4": ("uuid.uuid4()", "ctx.uuid()"),
    "datetime.now": ("datetime.now()", "ctx.now()"),
    "os.urandom": ("os.urandom()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "secrets.token_hex": ("secrets.token_hex()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "time.sleep": ("time.sleep()", "ctx.sleep(timedelta(...))"),
    "from random import randint": ("random.randint()", "ctx.random_u64(...) or ctx.random_string(...)"),
    "from uuid import uuid4": ("uuid.uuid4()", "ctx.uuid()"),
    "import datetime as dt": ("datetime.now()", "ctx.now()"),
    "dt.date.today": ("date.today()", "ctx.now().date()"),
}


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
@pytest.mark.parametrize("what", list(FORBIDDEN))
def test_non_deterministic_calls_in_a_workflow_fail_it_naming_the_ctx_call(what, blocking):
    """Item 5 (§8.2): a workflow that calls the clock, the random module, ``uuid4`` or
    ``os.urandom`` (names imported into its module, ``from datetime import datetime``
    included) finishes failed (never retried), and the failure names the ``ctx`` call to
    use instead; it fails the same way when the call comes in a replaying run."""
    spec = workflows.forbidden
    execution_id = create_root(spec, what)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    failure = result(execution_id)
    name, instead = FORBIDDEN[what]
    assert failure.kind == "uncategorized"
    assert failure.reason == (
        f"workflow trap: DeterminismError: `{name}` is not deterministic and cannot be used in a workflow "
        f"(it would differ on replay); use `{instead}`"
    )
    assert [type(e) for e in events(execution_id)].count(Finished) == 1


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_the_same_calls_work_in_an_activity_of_a_workflow_module(blocking):
    """Item 5: the guard is per thread and only while workflow code runs: an activity of the
    same (guarded) module calls ``time.time()``, ``random.random()``, ``uuid.uuid4()``,
    ``datetime.now()`` and ``os.urandom()`` freely, also while a workflow runs (Await: the
    workflow waits in its thread while the activity runs in this one)."""
    spec = workflows.calls_impure_activity
    execution_id = create_root(spec)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    value = result(execution_id).value
    assert set(value) == {"time", "random", "uuid", "now", "urandom"}
    assert value["time"] > 0 and 0 <= value["random"] < 1 and len(value["urandom"]) == 8
    direct = workflows.impure_values()
    assert direct["uuid"] != value["uuid"]


# ---------------------------------------------------------------------------------------------
# Decision 9 and fatal errors with unawaited children, through the store
# ---------------------------------------------------------------------------------------------


def test_join_next_try_that_found_a_response_counts_in_the_store_too():
    """Decision 9: a ``JoinNextTry`` that found a response consumes it in memory and in the
    database: the following join-next waits for the *second* response, so with only one
    delivered the store blocks the row (it does not resolve it with the first); a replay
    gives the recorded outcomes."""
    execution_id = new_driven()
    run1 = start_run(execution_id)
    join_set = run1.history.create_join_set()
    a = run1.history.submit(join_set, FN1, [2])
    b = run1.history.submit(join_set, FN1, [4])
    assert run1.history.try_join_next(join_set) is None
    finish_child(str(a), Ok(4))
    run1.hand_back()
    run2 = start_run(execution_id)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [2])
    run2.history.submit(join_set, FN1, [4])
    assert run2.history.try_join_next(join_set) is None  # recorded as pending
    assert run2.history.try_join_next(join_set) == (a, True)
    with pytest.raises(WorkflowInterrupt):
        run2.history.join_next(join_set)
    assert store.get_state(execution_id).state == "blocked_by_join_set"
    finish_child(str(b), Ok(8))
    assert store.get_state(execution_id).state == "pending_at"
    recorded = history_events(execution_id)
    run3 = start_run(execution_id)
    run3.history.create_join_set()
    run3.history.submit(join_set, FN1, [2])
    run3.history.submit(join_set, FN1, [4])
    assert [run3.history.try_join_next(join_set), run3.history.try_join_next(join_set)] == [None, (a, True)]
    assert run3.history.join_next(join_set) == (b, True)
    run3.end()
    assert history_events(execution_id) == recorded
    assert_versions_contiguous(execution_id)


def test_nondeterminism_still_cancels_unawaited_activities_and_their_responses_are_stored(monkeypatch):
    """Decision 2 (Q4) through the store: after nondeterminism the run still cancels the
    unawaited activities (no closing join-nexts: the history is inconsistent) and finishes
    the workflow; the cancelled child then finishes and its response is delivered to the
    finished parent without error, so nothing is left cancelling."""
    monkeypatch.setattr(workflows, "CODE_VERSION", "A")
    spec = workflows.changing
    monkeypatch.setitem(
        workflows.PLANS,
        "unawaited",
        {
            "A": [("join_set", None), ("submit_hang",), ("call", "fn1", 2)],
            "B": [("join_set", None), ("submit_hang",), ("call", "fn1", 4)],
        },
    )
    execution_id = create_root(spec, "unawaited")
    world = World(execution_id)
    run_root(execution_id, spec)
    world.settle()
    monkeypatch.setattr(workflows, "CODE_VERSION", "B")
    run_root(execution_id, spec)
    assert result(execution_id).kind == "nondeterminism_detected"
    hang = f"{execution_id}.g:1_1"
    assert store.get_state(hang).lifecycle == "cancelling"
    world.settle()
    assert result(hang).kind == "cancelled"
    assert [r.child_execution_id for r in store.get(execution_id).responses] == [f"{execution_id}.o:1-fn1_1", hang]
    assert_versions_contiguous(execution_id)


def test_ctx_now_is_a_datetime_in_a_module_that_imports_datetime():
    """The guard must not change what ``datetime`` *is* for workflow code: after
    ``from datetime import datetime`` in a workflow module, ``isinstance(ctx.now(),
    datetime)`` holds, as it does everywhere else."""
    spec = workflows.now_is_a_datetime
    execution_id = create_root(spec)
    complete(execution_id, spec, World(execution_id))
    assert result(execution_id) == Ok([True, True, "datetime"])


GUARDED_MODULE_SOURCE = """
from datetime import date, datetime
from workers import activity, workflow

@workflow(name="test:wf/annotated.first")
def first(ctx) -> None:
    return None

@workflow(name="test:wf/annotated.second")
def second(ctx, when: datetime, day: date) -> str:
    return when.isoformat() + day.isoformat()

@activity(name="test:wf/annotated.act")
def act(when: datetime) -> datetime:
    return when
"""


def test_datetime_annotations_register_in_a_workflow_module():
    """The guard must not break the typed signatures of a workflow module: a workflow or an
    activity declared after the module's first ``@workflow`` may take and return
    ``datetime`` / ``date`` (the registry builds their pydantic types from the annotations,
    which then name the guarded stand-ins)."""
    module = types.ModuleType("tests_wf_annotated")
    module.__file__ = __file__
    sys.modules[module.__name__] = module
    try:
        exec(compile(GUARDED_MODULE_SOURCE, "<tests_wf_annotated>", "exec", dont_inherit=True), module.__dict__)
        second = module.second
        assert second.encode_arguments(["2024-05-01T10:00:00Z", "2024-05-01"]) == [
            "2024-05-01T10:00:00Z",
            "2024-05-01",
        ]
        assert module.act.encode_result(datetime.fromisoformat("2024-05-01T10:00:00+00:00")) == "2024-05-01T10:00:00Z"
    finally:
        sys.modules.pop(module.__name__, None)
        for spec in list(registry._FUNCTIONS.values()):  # later tests register what exists
            if spec.fn.__module__ == module.__name__:
                del registry._FUNCTIONS[spec.ffqn]


def test_an_await_wait_nobody_answers_ends_at_the_deadline_without_extending_the_lock():
    """Decision 5: an Await wait ends at the lock's deadline minus the leeway; the run
    interrupts, the row stays blocked with ``run_expires_at`` = the lock's (unextended)
    expiry; the response makes it pending at that expiry, and the next run replays."""
    execution_id = new_driven()
    run1 = start_run(execution_id, AWAIT_0, lock_duration=timedelta(seconds=1))
    expiry = run1.locked.locked.lock_expires_at
    join_set = run1.history.create_join_set()
    child = run1.history.submit(join_set, FN1, [2])
    with pytest.raises(WorkflowInterrupt):
        run1.history.join_next(join_set)
    state = store.get_state(execution_id)
    assert (state.state, state.join_set_id, state.pending_expires_finished) == ("blocked_by_join_set", "g:1", expiry)
    assert history_events(execution_id)[-1][1].run_expires_at == expiry
    finish_child(str(child), Ok(4))
    assert store.get_state(execution_id).pending_expires_finished == expiry
    recorded = history_events(execution_id)
    run2 = start_run(execution_id, AWAIT_0)
    run2.history.create_join_set()
    run2.history.submit(join_set, FN1, [2])
    assert run2.history.join_next(join_set) == (child, True)
    run2.end()
    assert history_events(execution_id) == recorded
    assert_versions_contiguous(execution_id)


# ---------------------------------------------------------------------------------------------
# Logs and backtraces (issue 12 item 5, spec 002 §2.15)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("blocking", ["interrupt", "await"])
def test_runs_capture_their_logs_and_a_replay_marks_what_it_logs_again(blocking):
    """What a workflow logs is stored per run with its level, and a replaying run does not
    log it again as new (§2.15); a blocking call's stack is stored as a backtrace of the
    workflow's own frames. (Activities' capture: tests/workers/test_workers.py.)"""
    spec = workflows.talkative
    execution_id = create_root(spec, 7)
    complete(execution_id, spec, World(execution_id), blocking=blocking)
    assert result(execution_id) == Ok(7)

    lines = [(e.run_id, e.level, e.message) for e in store.list_logs(execution_id)]
    first_run = lines[0][0]
    assert (first_run, "info", "calling chatty with 7") in lines
    assert any(level == "info" and message == "chatty returned 7" for _, level, message in lines)
    # Interrupt: the second run replays the first line; a replay does not log it again as
    # new (ctx.log demotes it to DEBUG, below what the obelisk loggers let through).
    at_least_info = [message for _, level, message in lines if level in ("info", "warn", "error")]
    assert at_least_info.count("calling chatty with 7") == 1, lines

    backtraces = store.list_backtraces(execution_id)
    assert backtraces, "the blocking call's stack was not stored"
    frames = backtraces[0][2]
    assert frames[-1]["function"] == "talkative" and "ctx.call" in frames[-1]["code"], frames  # innermost last
    assert not any("/workers/" in frame["file"] for frame in frames)
    source = {frame["file"]: Path(frame["file"]).read_text().splitlines() for frame in frames}
    assert all(source[frame["file"]][frame["line"] - 1].strip() == frame["code"] for frame in frames), frames
