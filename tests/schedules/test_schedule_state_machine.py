"""The store's schedules against a small model of their specification (D113, D115).

Hypothesis drives one schedule (a 1-second interval, a random overlap policy and catch-up
window) through random sequences of: the clock moving on, a fire pass
(``store.fire_due_schedules`` with ``now=``), an unfinished execution finishing
(locked and finished through the store, as a worker does), pause, resume and trigger. The
clock is the model's: every store call gets ``now=``.

After every step, from the spec alone (not the store's code):

- every tick's execution exists at most once, with the id derived from the tick;
- every nominal tick from the schedule's creation (or its last resume) up to the last fire
  pass is accounted for exactly once in ``t_schedule_tick``, as started, skipped, buffered,
  missed or superseded (a collapsed ``missed`` record stands for every tick from its own
  up to the start of the catch-up window it was fired in), and none is started twice;
- the ticks of a paused time are not recorded at all;
- a tick marked ``buffered`` is one still waiting in the schedule's buffer (not one a
  pause, a resume or a change dropped);
- with skip, buffer_one or buffer_all, at most one clock-started execution is unfinished.

why: D113, D115
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from executions import schedules, store
from executions.events import Finished, Ok
from executions.models import ExecutionState, Schedule, ScheduleTick
from executions.schedule_spec import ScheduleSpec, tick_execution_id
from executions.state_machine import Lifecycle, State
from tests.support.helpers import deploy_components, lock

T0 = datetime(2031, 6, 1, 12, 0, 0, 250_000, tzinfo=UTC)
ONE_AT_A_TIME = {"skip", "buffer_one", "buffer_all"}
ACCOUNTED = {"started", "skipped", "buffered", "missed", "superseded"}
COLLAPSED = "ticks from "  # the reason of a `missed` record that stands for a range
_names = itertools.count()


class ScheduleMachine(RuleBasedStateMachine):
    @initialize(
        overlap=st.sampled_from(["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"]),
        window=st.sampled_from([0.5, 2.0, 5.0, 60.0]),
    )
    def create(self, overlap, window):
        self.schedule_id = f"machine-{next(_names)}"
        self.overlap, self.window = overlap, timedelta(seconds=window)
        self.now = T0
        request = schedules.ScheduleRequest(
            self.schedule_id, "test:acts/basic.add", [1, 2], interval_seconds=1, overlap=overlap,
            catchup_window_seconds=window,
        )  # fmt: skip
        row, _ = store.save_schedule(request.definition(), mode="create", now=self.now)
        self.key = row.key
        self.spec = ScheduleSpec.parse(interval_seconds=1)
        self.paused = False
        self.segment_start = self.now  # creation or the last resume
        self.segments: list[tuple[datetime, datetime]] = []  # (start, last fire) of past active times
        self.last_fire: datetime | None = None  # in the current active time
        self.executions: list[str] = []  # every execution the schedule started, oldest first

    def teardown(self):
        store.delete_schedule(self.schedule_id)

    # -- rules ---------------------------------------------------------------------------

    @rule(milliseconds=st.integers(1, 9000))
    def advance(self, milliseconds):
        self.now += timedelta(milliseconds=milliseconds)

    @rule()
    def fire(self):
        store.fire_due_schedules(schedules.prepare_tick, now=self.now)
        if not self.paused:
            self.last_fire = self.now
        self._learn_executions()

    @precondition(lambda self: bool(self.executions))
    @rule(pick=st.integers(0, 2))
    def finish_one(self, pick):
        """The oldest unfinished execution finishes (pick 0), or a later one."""
        unfinished = self._unfinished(self.executions)
        if not unfinished:
            return
        execution_id = unfinished[min(pick, len(unfinished) - 1)]
        state = store.get_state(execution_id)
        if state.lifecycle == Lifecycle.CANCELLING:  # cancel_other cancelled it: the sweep ends it
            store.finish_cancelled(execution_id, now=self.now)
            return
        locked = lock(execution_id, now=self.now)
        store.append(execution_id, locked.next_version, Finished(retval=Ok(3)), fence=locked.fence, now=self.now)

    @precondition(lambda self: not self.paused)
    @rule()
    def pause(self):
        store.set_schedule_paused(self.schedule_id, True, reason="a test", now=self.now)
        if self.last_fire is not None:
            self.segments.append((self.segment_start, self.last_fire))
        self.paused, self.last_fire = True, None

    @precondition(lambda self: self.paused)
    @rule()
    def resume(self):
        store.set_schedule_paused(self.schedule_id, False, now=self.now)
        self.paused, self.segment_start = False, self.now

    @rule()
    def trigger(self):
        execution_id = store.trigger_schedule(self.schedule_id, schedules.prepare_tick, now=self.now)
        if execution_id not in self.executions:
            self.executions.append(execution_id)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def each_tick_is_one_execution_with_its_derived_id(self):
        started = [r for r in self._records() if r.action == "started"]
        clock = Counter(r.nominal_at for r in started if not r.manual)
        assert all(count == 1 for count in clock.values()), "a tick was started twice"
        for record in started:
            assert record.execution_id == tick_execution_id(self.key, record.nominal_at)
        ids = {r.execution_id for r in started}
        assert ExecutionState.objects.filter(execution_id__in=ids).count() == len(ids)

    @invariant()
    def every_tick_up_to_the_last_fire_is_accounted_for_exactly_once(self):
        expected = self._expected_ticks()
        covered: Counter = Counter()
        clock = [r for r in self._records() if not r.manual]
        for record in clock:
            assert record.action in ACCOUNTED, (record.nominal_at, record.action, record.reason)
            if record.action == "missed" and record.reason.startswith(COLLAPSED):
                window_start = record.recorded_at - self.window
                covered.update(t for t in expected if record.nominal_at <= t < window_start)
                assert record.nominal_at in expected
            else:
                covered[record.nominal_at] += 1
        unaccounted = [t for t in expected if covered[t] == 0]
        twice = [t for t, n in covered.items() if n > 1]
        unexpected = [t for t in covered if t not in set(expected)]
        assert not unaccounted and not twice and not unexpected, {
            "unaccounted": unaccounted,
            "twice": twice,
            "not a tick of an active time (paused?)": unexpected,
            "records": [(r.nominal_at, r.action, r.reason) for r in clock],
        }

    @invariant()
    def one_at_a_time_policies_never_run_two_clock_ticks_at_once(self):
        if self.overlap not in ONE_AT_A_TIME:
            return
        clock = [r.execution_id for r in self._records() if r.action == "started" and not r.manual]
        unfinished = self._unfinished(clock)
        assert len(unfinished) <= 1, unfinished

    @invariant()
    def a_tick_marked_buffered_is_one_still_waiting(self):
        row = Schedule.objects.get(schedule_id=self.schedule_id)
        waiting = {datetime.fromisoformat(t) for t in row.buffered}
        marked = {r.nominal_at for r in self._records() if r.action == "buffered"}
        assert marked == waiting, f"marked buffered: {sorted(marked)}, waiting: {sorted(waiting)}"

    # -- helpers -----------------------------------------------------------------------------

    def _records(self) -> list[ScheduleTick]:
        return list(ScheduleTick.objects.filter(schedule_id=self.schedule_id).order_by("nominal_at", "id"))

    def _expected_ticks(self) -> list[datetime]:
        """The spec's ticks of every active time, up to that time's last fire pass."""
        active = list(self.segments)
        if self.last_fire is not None:
            active.append((self.segment_start, self.last_fire))
        ticks = []
        for start, last in active:
            ticks += [t for t in self.spec.next_times(start, 10_000) if t <= last] if last > start else []
        return ticks

    def _learn_executions(self) -> None:
        for record in self._records():
            if record.action == "started" and record.execution_id not in self.executions:
                self.executions.append(record.execution_id)

    def _unfinished(self, ids: list[str]) -> list[str]:
        states = dict(ExecutionState.objects.filter(execution_id__in=ids).values_list("execution_id", "state"))
        return [i for i in ids if states.get(i) not in (None, State.FINISHED)]


@pytest.mark.django_db
def test_schedules_account_for_every_tick_once_whatever_the_clock_and_the_operators_do():
    deploy_components()
    run_state_machine_as_test(
        ScheduleMachine,
        settings=settings(
            max_examples=int(os.environ.get("S3_EXAMPLES", 30)),
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


@pytest.mark.django_db
def test_a_trigger_does_not_let_skip_run_two_clock_ticks_at_once_in_the_model_run():
    """A tick runs; an operator triggers one, which finishes first; the next tick must
    still see the first one running (skip: it is skipped)."""
    deploy_components()
    machine = ScheduleMachine()
    machine.create(overlap="skip", window=60.0)
    try:
        machine.advance(1000)
        machine.fire()  # the tick at 12:00:01 starts
        machine.trigger()
        machine.finish_one(pick=1)  # the triggered execution finishes, the tick's does not
        machine.advance(1000)
        machine.fire()
        machine.one_at_a_time_policies_never_run_two_clock_ticks_at_once()
        machine.every_tick_up_to_the_last_fire_is_accounted_for_exactly_once()
    finally:
        machine.teardown()


@pytest.mark.django_db
def test_a_buffered_tick_a_pause_dropped_is_not_left_marked_buffered_in_the_model_run():
    """buffer_one: a tick waits for the running one; the schedule is paused and resumed,
    which empties its buffer; the tick's record must then say what became of it."""
    deploy_components()
    machine = ScheduleMachine()
    machine.create(overlap="buffer_one", window=60.0)
    try:
        machine.advance(1000)
        machine.fire()  # 12:00:01 starts
        machine.advance(1000)
        machine.fire()  # 12:00:02 waits
        machine.a_tick_marked_buffered_is_one_still_waiting()
        machine.pause()
        machine.resume()
        machine.a_tick_marked_buffered_is_one_still_waiting()
    finally:
        machine.teardown()
