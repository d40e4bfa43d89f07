"""``workers.testing.run_workflow`` (issue 41): a workflow run to its end in the test's own
process, on the real store, on virtual time, with activities stubbed per function.

- Virtual time: sleeps, delays, retry back-offs and scheduled executions fire when nothing
  else can run; ``ctx.now()`` and the recorded times follow the virtual clock.
- Each kind of stub (value, ``ActivityError``, exception retried as configured, callable,
  sequence), calls recorded; real activities run with ``current_activity()``.
- Child workflows and their failures, cancellation by a join set's close, the
  determinism guard, ``replay_check`` catching nondeterminism.
- Bad input is a clear error: unknown function, a value not fitting the return type, a
  stub of a workflow, an exhausted sequence, unused stubs, a non-transactional test.

why: D120, D121, D122
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from executions import store
from executions.events import ExecutionFailure, Finished, HistoryEventRecord, Ok
from tests.support import toolkit_components as c
from workers import ActivityError
from workers.testing import (
    Nondeterministic,
    StubError,
    Stuck,
    UnusedStubWarning,
    run_workflow,
    sequence,
    timed_out,
)

START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


# -- virtual time -----------------------------------------------------------------------------


def test_a_day_long_sleep_passes_in_virtual_time_and_ctx_now_follows_it(obelisk_env):
    run = obelisk_env.run(c.sleeps_a_day, now=START)
    value = run.value
    assert datetime.fromisoformat(value["before"]) == START
    assert datetime.fromisoformat(value["fired"]) == START + timedelta(days=1)
    assert datetime.fromisoformat(value["after"]) == START + timedelta(days=1)
    assert run.elapsed == timedelta(days=1)


def test_the_history_records_the_virtual_times(obelisk_env):
    run = obelisk_env.run(c.five_steps_and_an_hour, 1, now=START)
    assert run.value == {"n": 6, "at": (START + timedelta(hours=1)).isoformat()}
    times = [record.created_at for record in run.history()]
    assert times[0] == START and times[-1] == START + timedelta(hours=1)
    assert times == sorted(times)
    assert run.events().count("DelayRequest") == 0  # a sleep is a join set with a delay
    assert "JoinSetRequest" in run.events() and run.events()[-1] == "Finished"


def test_a_delay_that_comes_first_cancels_the_activity_still_retrying(obelisk_env):
    """The fetch fails and backs off 5 minutes, then 10: the 10-minute delay comes first,
    and leaving the join set cancels the fetch."""
    run = obelisk_env.run(c.races_a_delay, "k", activities={c.fetch: ConnectionError("down")}, now=START)
    assert run.value == {"winner": "delay", "at": (START + timedelta(minutes=10)).isoformat()}
    (fetch_row, fetch_result), *_ = [(row, r) for row, r in run.children() if row.ffqn == c.fetch.ffqn]
    assert isinstance(fetch_result, ExecutionFailure) and fetch_result.kind == "cancelled"
    assert [call.attempt for call in run.calls_of(c.fetch)] == [1, 2]


def test_an_activity_that_comes_first_wins_the_race(obelisk_env):
    run = obelisk_env.run(c.races_a_delay, "k", activities={c.fetch: 3}, now=START)
    assert run.value == {"winner": "fetch", "at": START.isoformat()}


def test_retries_back_off_in_virtual_time(obelisk_env):
    stub = sequence(ConnectionError("one"), TimeoutError("two"), 42)
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch: stub}, now=START)
    assert run.value == {"key": "k", "value": 42}
    calls = run.calls_of(c.fetch)
    assert [(call.attempt, call.outcome) for call in calls] == [
        (1, {"raised": "ConnectionError: one"}),
        (2, {"raised": "TimeoutError: two"}),
        (3, {"ok": 42}),
    ]
    assert run.elapsed == timedelta(minutes=5 + 10)  # backoff 5 min, doubled


def test_a_scheduled_execution_runs_at_its_virtual_time(obelisk_env):
    run = obelisk_env.run(c.schedules_a_step, 4, now=START)
    scheduled = run.value
    assert store.get_finished_result(scheduled) == Ok(5)
    assert store.get_state(scheduled).first_scheduled_at == START + timedelta(days=2)
    assert run.finished_at == START + timedelta(days=2)


# -- stubs ------------------------------------------------------------------------------------


def test_a_value_stub_is_the_activity_result_and_the_call_is_recorded(obelisk_env):
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch: 7})
    assert run.value == {"key": "k", "value": 7}
    (call,) = run.calls_of(c.fetch)
    assert call.args == ("k",) and call.attempt == 1 and call.stubbed and call.outcome == {"ok": 7}


def test_an_activity_error_stub_is_the_error_value_the_workflow_sees(obelisk_env):
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch: ActivityError("no such key", retryable=False)})
    failure = run.failure
    assert failure is not None and failure.kind == "uncategorized" and "no such key" in failure.reason
    assert len(run.calls_of(c.fetch)) == 1


def test_an_exception_stub_is_retried_as_configured_then_fails(obelisk_env):
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch: ConnectionError}, now=START)
    assert run.failure is not None and "ConnectionError" in run.failure.reason
    assert [call.attempt for call in run.calls_of(c.fetch)] == [1, 2, 3, 4]  # max_retries=3
    assert run.elapsed == timedelta(minutes=5 + 10 + 20)


def test_a_callable_stub_gets_the_arguments_and_the_activity_context(obelisk_env):
    from workers import current_activity

    seen = []

    def fake(key: str) -> int:
        seen.append((key, current_activity().attempt))
        return len(key)

    run = obelisk_env.run(c.fetches_twice, activities={c.fetch: fake})
    assert run.value == [1, 1] and seen == [("a", 1), ("b", 1)]
    assert [call.args for call in run.calls_of(c.fetch)] == [("a",), ("b",)]


def test_a_sequence_gives_one_outcome_per_call(obelisk_env):
    run = obelisk_env.run(c.fetches_twice, activities={c.fetch: sequence(10, 20)})
    assert run.value == [10, 20]


def test_a_timed_out_stub_is_retried_as_a_timeout_then_finishes_timed_out(obelisk_env):
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch: sequence(timed_out, 9)})
    assert run.value["value"] == 9
    ((row, _),) = run.children()
    kinds = [type(record.event).__name__ for record in run.history(row.execution_id)]
    assert "TemporarilyTimedOut" in kinds
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch: timed_out})
    assert run.failure is not None and "timed_out" in run.failure.reason
    ((row, retval),) = run.children()
    assert isinstance(retval, ExecutionFailure) and retval.kind == "timed_out"


def test_cancelling_the_workflow_from_an_activity_ends_it_cancelled(obelisk_env):
    """A cancellation requested while the workflow runs (here by the activity it waits
    for) is carried out by the sweep, as under a worker: the children first."""
    from executions import client
    from workers import current_activity

    def cancels_its_parent(key: str) -> int:
        client.cancel(current_activity().execution_id.rpartition(".")[0])
        return 1

    run = obelisk_env.run(c.fetches_twice, activities={c.fetch: cancels_its_parent})
    assert run.failure is not None and run.failure.kind == "cancelled"
    assert len(run.calls_of(c.fetch)) == 1


def test_stubs_are_given_by_name_too(obelisk_env):
    run = obelisk_env.run(c.fetches, "k", activities={c.fetch.ffqn: 1})
    assert run.value["value"] == 1


def test_a_real_activity_runs_in_process_with_current_activity(obelisk_env):
    run = obelisk_env.run(c.asks_who)
    ((child, _),) = run.children()
    assert run.value == {"label": "me", "attempt": 1, "execution_id": child.execution_id}
    (call,) = run.calls_of(c.whoami)
    assert not call.stubbed and call.outcome == {"ok": run.value}


# -- children, errors, the guard ----------------------------------------------------------------


def test_a_child_workflow_runs_and_each_execution_has_its_history(obelisk_env):
    run = obelisk_env.run(c.parent_of_child, "k", activities={c.fetch: 4})
    assert run.value == {"child": 40}
    kinds = sorted(row.ffqn for row, _ in run.tree)
    assert kinds == sorted([c.parent_of_child.ffqn, c.child_fetches.ffqn, c.fetch.ffqn])
    assert all(isinstance(run.histories[row.execution_id][-1].event, Finished) for row, _ in run.tree)


def test_a_child_failure_reaches_the_parent(obelisk_env):
    run = obelisk_env.run(c.parent_of_child, "k", activities={c.fetch: ActivityError("gone", retryable=False)})
    assert "gone" in run.value["child_failed"]


def test_an_error_value_of_a_real_activity_reaches_the_workflow(obelisk_env):
    run = obelisk_env.run(c.gets_refused)
    assert run.value.startswith("refused: ") and "no" in run.value


def test_the_determinism_guard_is_on(obelisk_env):
    run = obelisk_env.run(c.reads_the_clock)
    assert run.failure is not None
    assert "time.time()" in run.failure.reason and "ctx.now()" in run.failure.reason


def test_replay_check_catches_a_workflow_that_does_not_replay(obelisk_env):
    c.FLIPS["count"] = 0
    with pytest.raises(Nondeterministic) as caught:
        obelisk_env.run(c.flips, activities={c.fetch: 1}, replay_check=True)
    message = str(caught.value)
    assert "history `o:1-step`, code `o:1-fetch`  (differs)" in message  # the engine's side by side
    c.FLIPS["count"] = 0
    obelisk_env.runs.clear()  # the fetch stub went unused: this test is about the check


def test_without_replay_check_the_next_run_finds_the_nondeterminism_as_a_worker_would(obelisk_env):
    c.FLIPS["count"] = 0
    run = obelisk_env.run(c.flips, activities={c.fetch: 1})
    c.FLIPS["count"] = 0
    assert run.failure is not None and run.failure.kind == "nondeterminism_detected"
    assert "(differs)" in run.failure.detail
    obelisk_env.runs.clear()


def test_replay_check_passes_a_deterministic_workflow(obelisk_env):
    run = obelisk_env.run(c.parent_of_child, "k", activities={c.fetch: 4}, replay_check=True)
    assert run.value == {"child": 40}
    assert any(isinstance(r.event, HistoryEventRecord) for r in run.history())


# -- bad input ----------------------------------------------------------------------------------


def test_an_unknown_function_name_is_a_clear_error(obelisk_env):
    with pytest.raises(StubError, match="py:nowhere/at_all.fn"):
        obelisk_env.run(c.fetches, "k", activities={"py:nowhere/at_all.fn": 1})


def test_a_value_that_does_not_fit_the_return_type_is_a_clear_error(obelisk_env):
    with pytest.raises(StubError, match=f"{c.fetch.ffqn} does not fit its return type"):
        obelisk_env.run(c.fetches, "k", activities={c.fetch: "not a number"})
    with pytest.raises(StubError, match="does not fit"):
        obelisk_env.run(c.fetches, "k", activities={c.fetch: sequence(ConnectionError(), "nope")})


def test_a_workflow_cannot_be_stubbed(obelisk_env):
    with pytest.raises(StubError, match="only activities are stubbed"):
        obelisk_env.run(c.parent_of_child, "k", activities={c.child_fetches: 1})


def test_an_exhausted_sequence_stops_the_run_with_what_happened(obelisk_env):
    with pytest.raises(Stuck, match="stub sequence has 1 outcome"):
        obelisk_env.run(c.fetches_twice, activities={c.fetch: sequence(1)})


def test_a_workflow_that_can_never_finish_is_stuck_not_hanging(obelisk_env):
    """Paused by its own activity, nothing will ever run it again: ``Stuck`` names it."""
    from executions import client
    from workers import current_activity

    def pauses_its_parent(key: str) -> int:
        client.pause(current_activity().execution_id.rpartition(".")[0])
        return 1

    with pytest.raises(Stuck, match="cannot finish: .*nothing is due now or later"):
        obelisk_env.run(c.fetches_twice, activities={c.fetch: pauses_its_parent})


def test_an_unused_stub_is_reported_at_the_end(obelisk_env):
    obelisk_env.run(c.asks_who, activities={c.fetch: 1})
    error = obelisk_env.unused_stubs()
    assert error is not None and c.fetch.ffqn in str(error) and "never called" in str(error)
    obelisk_env.runs.clear()  # reported: the fixture would fail this test at teardown


@pytest.mark.django_db(transaction=True)
def test_run_workflow_without_the_fixture_warns_of_unused_stubs():
    with pytest.warns(UnusedStubWarning, match=c.fetch.ffqn):
        run_workflow(c.asks_who, activities={c.fetch: 1})


@pytest.mark.django_db
def test_a_test_inside_a_transaction_runs_its_workflow_and_keeps_its_connection():
    from django.db import connection

    run = run_workflow(c.asks_who)
    assert run.value["attempt"] == 1
    assert connection.in_atomic_block and store.get_state(run.execution_id).is_finished


@pytest.mark.django_db(transaction=True)
def test_a_transactional_test_runs_its_workflow_too(obelisk_env):
    assert obelisk_env.run(c.fetches, "k", activities={c.fetch: 2}).value["value"] == 2


def test_an_activity_is_not_run_as_a_workflow(obelisk_env):
    with pytest.raises(TypeError, match="runs workflows"):
        obelisk_env.run(c.step, 1)


# -- the fixture's registry ---------------------------------------------------------------------


def test_a_workflow_defined_in_the_test_runs_and_is_forgotten_afterwards(obelisk_env):
    from workers import registry, workflow

    @workflow(name="test:toolkit/local.adds")
    def adds(ctx, n: int) -> int:
        return ctx.call(c.step, n) + 100

    assert obelisk_env.run(adds, 1).value == 102
    assert registry.lookup("test:toolkit/local.adds") is not None


def test_the_fixture_forgets_local_functions_and_keeps_imported_ones(obelisk_env):
    """What ``obelisk_env`` does at teardown: a module imported during the test stays
    registered (it will not be imported again), a function of the test's body goes."""
    from workers import registry, workflow
    from workers.testing.plugin import _forget_local_functions

    saved = registry.registered()

    @workflow(name="test:toolkit/local.doubles")
    def doubles(ctx, n: int) -> int:
        return 2 * n

    _forget_local_functions(registry, saved)
    assert registry.lookup("test:toolkit/local.doubles") is None
    assert registry.lookup(c.step.ffqn) is c.step
