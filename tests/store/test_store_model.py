"""The execution store against a small in-memory model of its specification.

Example tests check the transitions someone thought of; this test lets hypothesis drive the
real store (``executions.store``, on the real database) through random sequences of
operations and compares everything observable after every step with a model written from
the specification, not from the store's code: spec 000 §4 (states), §5 (the state machine),
§6 (lock rules, responses), §10 (retries and lock expiry), the decisions in
``shared/spec/README.md`` (9 join-next counting, 12 lock rules, 13 idempotent create, 14
cancel, 15 exact values) and ``docs/decisions.md`` (D8 revocation, D9 order of checks, D9a
fenced writes without a version, D10 child responses, D11 expired cancelling locks, D12
retries decided in the store, D18 cancel outcomes, D19 create, D26 cancelling workflows wait
for their children, D27 renewals are heartbeats, D30 expired locks count), plus the contract
of issue 11 (items 2, 5, 6, 7, 8, 9, 10).

The clock is the model's: every store call gets ``now=``, and rules move it forward. Where
the specification does not settle an outcome, the rule does not make that call rather than
guess. The scripted runs at the end drive the same machine through the paths random runs
reach only sometimes (a cancelling workflow waiting for its child, a JoinNext finding its
response, keep-warm and re-lock generations, retries running out), so every run covers them.

The model itself is ``tests/support/store_model.py``.

why: D8, D9, D9a, D10, D11, D12, D18, D19, D26, D27, D30
"""

from __future__ import annotations

import copy
from collections import defaultdict
from datetime import timedelta

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

from executions import errors, store
from executions.events import (
    ChildExecutionRequest,
    Err,
    ExecutionFailure,
    Finished,
    JoinNext,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    TemporarilyFailed,
    Unlocked,
)
from executions.ids import ExecutionId, JoinSetId
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from tests.support.helpers import (
    DEPLOYMENT,
    FFQN,
    TERMS,
    WORKFLOW_FFQN,
    WORKFLOW_TERMS,
    history,
)
from tests.support.store_model import (
    ACTIVE,
    ACTIVITY_TERMS,
    BLOCKED,
    CANCELLING,
    FINISHED,
    INDEX,
    LOCK_DURATION,
    LOCKED,
    ONE_RETRY,
    PARAMS,
    PAUSED,
    PENDING,
    RK_ERR,
    RK_OK,
    Model,
    ModelledStore,
    exact,
    expected_row,
    observed_row,
    retry_delay,
    retval_of,
    rk_failure,
    same_params,
)

pytestmark = pytest.mark.django_db


class StoreMachine(ModelledStore, RuleBasedStateMachine):
    """The real store driven by hypothesis's rules; after every step the invariant compares
    everything observable with the model (``ModelledStore``)."""

    # -- the clock --------------------------------------------------------------------------

    @rule(seconds=st.sampled_from([1, 5, 11]))
    def advance_clock(self, seconds):
        self.now += timedelta(seconds=seconds)

    # -- create (decision 13, D19, decision 15, contract items 7 and 8) -----------------------

    @initialize(activity_params=PARAMS, workflow_params=PARAMS)
    def one_of_each(self, activity_params, workflow_params):
        self.create_new("activity", activity_params, False, 0)
        self.create_new("workflow", workflow_params, False, 0)

    @rule(
        how=st.sampled_from(["new", "new", "again", "many"]),
        kind=st.sampled_from(["activity", "workflow"]),
        params=PARAMS,
        paused=st.booleans(),
        later=st.sampled_from([0, 0, 3]),
        index=INDEX,
        flag=st.booleans(),
        existing=st.sampled_from(["none", "identical", "conflicting"]),
        ask=st.sampled_from(["as_first", "as_first", "other_paused", "its_due_explicitly", "other_due"]),
    )
    def create(self, how, kind, params, paused, later, index, flag, existing, ask="as_first"):
        if how == "new":
            self.create_new(kind, params, paused, later)
        elif how == "again":
            self.create_again(index, params, same=flag, other_kind=kind == "workflow", ask=ask)
        else:
            self.create_many(index, 1 + index % 3, existing)

    def create_new(self, kind, params, paused, later):
        execution_id = self.new_execution_id()
        scheduled_at = self.now + timedelta(seconds=later) if later else None
        outcome = store.create(
            self.request(kind, execution_id, params, paused=paused, scheduled_at=scheduled_at), now=self.now
        )
        e = self.new_model(kind, execution_id, params, paused=paused, scheduled_at=scheduled_at)
        assert outcome == store.CreateOutcome(e.version + 1, already_existed=False)

    def create_again(self, index, params, same, other_kind, ask="as_first"):
        """A resubmission is the same call with the same function, arguments equal as JSON
        Schema compares them, the same ``paused`` and the same due time (none asks for the
        first request's creation instant), whatever happened to the execution since (D104)."""
        e = self.pick(index, lambda e: e.parent is None)
        if e is None:
            return
        kind = e.kind
        if same:
            params = copy.deepcopy(e.params)
        elif other_kind:
            kind = "workflow" if e.kind == "activity" else "activity"
        asked = {"paused": e.created_paused, "scheduled_at": e.created_scheduled_at}
        if ask == "other_paused":
            asked["paused"] = not e.created_paused
        elif ask == "its_due_explicitly":
            asked["scheduled_at"] = e.created_due
        elif ask == "other_due":
            asked["scheduled_at"] = e.created_due + timedelta(seconds=1)
        if kind == e.kind and same_params(params, e.params) and ask in ("as_first", "its_due_explicitly"):
            outcome = store.create(self.request(kind, e.id, params, **asked), now=self.now)
            assert outcome.already_existed
        else:
            self.unchanged(
                errors.Conflict, lambda: store.create(self.request(kind, e.id, params, **asked), now=self.now)
            )

    def create_many(self, index, new, existing):
        ids = [self.new_execution_id() for _ in range(new)]
        requests = [self.request("activity", i, [n]) for n, i in enumerate(ids)]
        old = self.pick(index, lambda e: e.parent is None)
        if old is not None and existing != "none":
            params = old.params if existing == "identical" else old.params + ["conflicting"]
            asked = {"paused": old.created_paused, "scheduled_at": old.created_scheduled_at}
            requests.insert(index % (len(requests) + 1), self.request(old.kind, old.id, copy.deepcopy(params), **asked))
        if old is not None and existing == "conflicting":
            self.unchanged(errors.Conflict, lambda: store.create_many(requests, now=self.now))
            return
        outcomes = store.create_many(requests, now=self.now)
        for req, outcome in zip(requests, outcomes, strict=True):
            if req.execution_id in self.execs:
                assert outcome.already_existed, req.execution_id
            else:
                assert not outcome.already_existed
                self.new_model("activity", req.execution_id, req.params)

    # -- locking (spec 000 §6.3, decision 12, D8, D16, contract item 10) --------------------

    @rule(terms=ACTIVITY_TERMS)
    def lock_pending(self, terms):
        executor_id, run_id = self.new_run()
        functions = {FFQN: terms, WORKFLOW_FFQN: WORKFLOW_TERMS}
        locked = store.lock_pending(
            functions,
            limit=100,
            executor_id=executor_id,
            run_id=run_id,
            deployment_id=DEPLOYMENT,
            now=self.now,
        )
        due = {e.id for e in self.execs.values() if e.state == PENDING and e.lifecycle == ACTIVE and e.at <= self.now}
        assert {item.execution_id for item in locked} == due
        for item in locked:
            e = self.execs[item.execution_id]
            self.m_lock(e, (executor_id, run_id), functions[e.ffqn], new=True)
            assert item.fence == e.fence
            assert item.next_version == e.version + 1
            assert item.intermittent_event_count == e.intermittent

    @rule(terms=ACTIVITY_TERMS)
    def lock_pending_activities(self, terms):
        """A claim of activities alone: on PostgreSQL outside a transaction, one statement
        (D69); it must lock exactly what the transaction would."""
        executor_id, run_id = self.new_run()
        locked = store.lock_pending(
            {FFQN: terms}, limit=100, executor_id=executor_id, run_id=run_id, deployment_id=DEPLOYMENT, now=self.now
        )
        due = {
            e.id
            for e in self.execs.values()
            if e.ffqn == FFQN and e.state == PENDING and e.lifecycle == ACTIVE and e.at <= self.now
        }
        assert {item.execution_id for item in locked} == due
        for item in locked:
            e = self.execs[item.execution_id]
            self.m_lock(e, (executor_id, run_id), terms, new=True)
            assert item.fence == e.fence
            assert item.next_version == e.version + 1
            assert item.intermittent_event_count == e.intermittent

    @precondition(lambda self: self.any_exec(lambda e: e.fences and e.state != FINISHED))
    @rule(data=st.data(), value=PARAMS)
    def group_commit(self, data, value):
        """An executor's group commit (``append_many``) of runs' results, some with a fence
        that is no longer the lock: each item succeeds or fails on its own. The results go in
        one statement on PostgreSQL outside a transaction (D70, D81), the refused ones (and a
        batch with a parent and its child) through the transaction."""
        candidates = [e for e in self.execs.values() if e.fences and e.state != FINISHED]
        chosen = data.draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=4, unique_by=lambda e: e.id))
        stale = data.draw(st.lists(st.booleans(), min_size=len(chosen), max_size=len(chosen)))
        items = []
        for e, late in zip(chosen, stale, strict=True):
            self.touched.add(e.id)
            fence = self.stale_fence(e, 0) if late or e.state != LOCKED else e.fence
            items.append(store.AppendItem(e.id, None, Finished(retval=Ok(value)), fence))
        results = store.append_many(items, now=self.now)
        for e, item, result in zip(chosen, items, results, strict=True):
            if item.fence == e.fence and e.state == LOCKED:
                assert result == e.version + 1
                self.m_finish(e, RK_OK, fenced=True, retval=("ok", exact(value)))
            else:
                assert isinstance(result, errors.LockLost), result

    @precondition(lambda self: self.execs)
    @rule(index=INDEX, by_holder=st.booleans(), lockable=st.booleans(), terms=ACTIVITY_TERMS)
    def lock_one(self, index, by_holder, lockable, terms):
        e = self.pick(index, lambda e: not lockable or (e.state in (PENDING, LOCKED) and e.lifecycle == ACTIVE))
        if e is None:
            return
        who = e.holder if by_holder and e.holder is not None else self.new_run()
        if e.kind == "workflow":
            terms = WORKFLOW_TERMS

        def call():
            return store.lock_one(
                e.id,
                e.version + 1,
                terms,
                executor_id=who[0],
                run_id=who[1],
                deployment_id=DEPLOYMENT,
                now=self.now,
            )

        # Spec 000 §6.3 can_append_lock, in the order of PendingState's variants.
        if e.state == FINISHED or e.lifecycle in (PAUSED, CANCELLING) or e.state == BLOCKED:
            self.unchanged(errors.IllegalState, call)
            return
        if e.state == LOCKED:
            if who != e.holder:  # nobody else locks a locked row, expired or not (decision 12)
                self.unchanged(errors.IllegalState, call)
                return
            new = False  # the holder extends
        elif e.at <= self.now:
            new = True  # due: a new lock, even for the last holder (contract item 10)
        elif who == e.holder:
            new = False  # keep-warm: the holder re-locks before the row is due
        else:
            self.unchanged(errors.ValidationFailed, call)
            return
        locked = call()
        self.m_lock(e, who, terms, new=new)
        assert locked.fence == e.fence
        assert locked.next_version == e.version + 1

    @precondition(lambda self: self.any_exec(lambda e: e.state == LOCKED))
    @rule(index=INDEX)
    def extend_lock_by_holder(self, index):
        """A heartbeat (contract item 6): no event, no version, the same generation; only the
        expiry moves. Allowed until the sweep handled an expired lock (decision 12), and while
        a cancellation is requested (the run keeps its lock until it stops, item 5)."""
        e = self.pick(index, lambda e: e.state == LOCKED)
        expiry = self.now + LOCK_DURATION
        # D27: the renewal returns the lifecycle, so a cancelling run learns it at once.
        assert store.extend_lock(e.id, e.fence, expiry, now=self.now) == e.lifecycle
        e.at = expiry

    # -- a run's own writes (spec 000 §5.2, D9, D9a, D12; spec 004 §5.1) -------------------

    @precondition(lambda self: self.any_exec(lambda e: e.holder is not None and e.state in (LOCKED, PENDING)))
    @rule(
        index=INDEX,
        what=st.sampled_from(
            ["ok", "err", "cancelled", "temporarily_failed", "attempt_failed", "attempt_timed_out", "unlocked"]
        ),
        explicit_version=st.booleans(),
        value=PARAMS,
    )
    def holder_appends(self, index, what, explicit_version, value):
        e = self.pick(index, lambda e: e.holder is not None and e.state in (LOCKED, PENDING))
        if what.startswith("attempt") and e.state != LOCKED:
            return  # the retry policy is the lock's; without a lock the spec does not say
        version = e.version + 1 if explicit_version else None
        if what == "ok":
            event, result, retval = Finished(retval=Ok(value)), RK_OK, ("ok", exact(value))
        elif what == "err":
            event, result, retval = Finished(retval=Err(value)), RK_ERR, ("err", exact(value))
        elif what == "cancelled":  # contract item 5: a cancelled run finishes itself
            retval = None
            event = Finished(retval=ExecutionFailure("cancelled", "cancellation requested while running"))
            result = rk_failure("cancelled")
        elif what == "temporarily_failed":
            event = TemporarilyFailed(backoff_expires_at=self.now + timedelta(seconds=2), reason="boom")
        elif what == "unlocked":
            event = Unlocked(unlocked_at=self.now, reason="handed back")
        else:
            final = Finished(retval=ExecutionFailure("uncategorized", "boom"))
            event = store.AttemptFailed(reason="boom", final=final, timed_out=what == "attempt_timed_out")

        def call():
            return store.append(e.id, version, event, fence=e.fence, now=self.now)

        # Unlocked only from locked: active (spec 000 §5.2) or cancelling (D26's new cell).
        if what == "unlocked" and e.state != LOCKED:
            self.unchanged(errors.UnlockedCannotBeAppended, call)
            return
        next_version = call()
        if isinstance(event, Finished):
            self.m_finish(e, result, fenced=True, retval=retval)
        elif what == "temporarily_failed":
            e.append("temporarily_failed")
            self.m_to_pending(e, event.backoff_expires_at, failures=1)
        elif what == "unlocked":
            e.append("unlocked")
            self.m_to_pending(e, self.now)
        else:  # D12: the store decides with the policy the execution was locked with
            max_retries, backoff = e.retry
            delay = retry_delay(e.intermittent + 1, max_retries, backoff)
            if delay is None:
                self.m_finish(e, rk_failure("uncategorized"), fenced=True)
            else:
                e.append("temporarily_timed_out" if what == "attempt_timed_out" else "temporarily_failed")
                self.m_to_pending(e, self.now + delay, failures=1)
        # Spec 000 §12.3: a Finished append returns its own version, others the next one.
        assert next_version == (e.version if e.state == FINISHED else e.version + 1)

    @precondition(lambda self: self.any_exec(lambda e: e.fences))
    @rule(index=INDEX, what=st.sampled_from(["extend", "ok", "temporarily_failed", "unlocked"]))
    def stale_fence_writes(self, index, what):
        """Spec 004 §5.1: a write whose fence is not the current lock fails with
        ``LockLost`` and writes nothing, whatever the row's state (D9: the fence first)."""
        e = self.pick(index, lambda e: e.fences)
        fence = self.stale_fence(e, index)
        if what == "extend":
            self.unchanged(
                errors.LockLost, lambda: store.extend_lock(e.id, fence, self.now + LOCK_DURATION, now=self.now)
            )
            return
        event = {
            "ok": Finished(retval=Ok(1)),
            "temporarily_failed": TemporarilyFailed(backoff_expires_at=self.now, reason="late"),
            "unlocked": Unlocked(unlocked_at=self.now, reason="late"),
        }[what]
        self.unchanged(errors.LockLost, lambda: store.append(e.id, None, event, fence=fence, now=self.now))

    @precondition(lambda self: self.execs)
    @rule(index=INDEX, version=st.sampled_from(["next", "stale", "none"]))
    def unfenced_write(self, index, version):
        """A write without a fence (spec 000 §5.2: a temporary failure is accepted from any
        unfinished state) is fenced by the version alone, which it must give (D9a); the
        finished check comes before the version (D9), and leaving ``locked`` this way revokes
        the holder's lock (D8)."""
        e = self.pick(index, lambda e: True)
        event = TemporarilyFailed(backoff_expires_at=self.now + timedelta(seconds=1), reason="unfenced")
        given = {"next": e.version + 1, "stale": e.version, "none": None}[version]

        def call():
            return store.append(e.id, given, event, now=self.now)

        if version == "none":
            self.unchanged(errors.ValidationFailed, call)
        elif e.state == FINISHED:
            self.unchanged(errors.AlreadyFinished, call)
        elif version == "stale":
            self.unchanged(errors.VersionConflict, call)
        else:
            assert call() == e.version + 2
            self.m_revoke(e, fenced=False)
            e.append("temporarily_failed")
            self.m_to_pending(e, event.backoff_expires_at, failures=1)

    # -- the timer sweep (spec 000 §10, D8, D11, contract items 2 and 9) ---------------------

    @rule(seconds=st.sampled_from([0, 5, 11]))
    def sweep(self, seconds):
        """Time passes, then the timer sweep handles every expired lock."""
        self.now += timedelta(seconds=seconds)
        delays, locks = store.get_expired_timers(now=self.now)
        assert delays == []
        expected = {e.id for e in self.execs.values() if e.state == LOCKED and e.at <= self.now}
        assert {lock.execution_id for lock in locks} == expected  # D11: cancelling ones too
        for execution_id in sorted(expected):
            e = self.execs[execution_id]
            self.touched.add(execution_id)
            event = store.expire_lock(execution_id, now=self.now)
            assert event is not None
            if e.lifecycle == CANCELLING:
                if e.kind == "workflow" and self.unfinished_children(e):  # contract item 9
                    assert event.VARIANT == "unlocked"
                    self.m_revoke(e, fenced=False)
                    e.append("unlocked")
                    self.m_to_pending(e, self.now)
                else:  # D11
                    assert event.VARIANT == "finished"
                    assert event.retval.kind == "cancelled"
                    self.m_finish(e, rk_failure("cancelled"), fenced=False)
                continue
            max_retries, backoff = e.retry
            if max_retries is None and e.last_lock_version < e.version:  # a workflow that made progress
                assert event.VARIANT == "unlocked"
                self.m_revoke(e, fenced=False)
                e.append("unlocked")
                self.m_to_pending(e, self.now)
                continue
            delay = retry_delay(e.intermittent + 1, max_retries, backoff)
            if delay is not None:
                assert event.VARIANT == "temporarily_timed_out"
                assert (event.reason or "").startswith("lock expired"), event  # contract item 2
                self.m_revoke(e, fenced=False)
                e.append("temporarily_timed_out")
                self.m_to_pending(e, self.now + delay, failures=1)
            else:
                assert event.VARIANT == "finished"
                assert event.retval.kind == "timed_out"
                assert (event.retval.reason or "").startswith("lock expired"), event  # contract item 2
                self.m_finish(e, rk_failure("timed_out"), fenced=False)

    # -- cancel, the cancellation driver, pause (decision 14, D18; spec 000 §5.2, §7.4) ------

    @precondition(lambda self: self.execs)
    @rule(index=INDEX, running_parent=st.booleans())
    def cancel(self, index, running_parent):
        e = None
        if running_parent:  # the case of contract item 9: a running workflow whose children run
            e = self.pick(index, lambda e: e.state == LOCKED and self.unfinished_children(e))
        e = e or self.pick(index, lambda e: True)
        outcome = store.cancel(e.id, now=self.now)
        if e.state == FINISHED:
            cancelled = e.result_kind == rk_failure("cancelled")
            assert outcome == (
                store.CancelOutcome.ALREADY_CANCELLED if cancelled else store.CancelOutcome.ALREADY_FINISHED
            )
        elif e.lifecycle == CANCELLING:
            assert outcome == store.CancelOutcome.ALREADY_CANCELLING
        else:
            assert outcome == store.CancelOutcome.REQUESTED
            e.append("cancellation_requested")
            e.lifecycle = CANCELLING  # the state itself is unchanged; a running lock stays

    @precondition(lambda self: self.execs)
    @rule(index=INDEX)
    def cancellation_driver(self, index):
        """The driver finishes a cancelling execution nobody runs: an activity at once, a
        workflow once its children are finished (D18). A live lock is left to its holder."""
        e = self.pick(index, lambda e: not (e.state == LOCKED and e.at <= self.now))
        if e is None:
            return  # an expired, unswept lock: the sweep's job (D11), not settled for the driver
        finished = store.finish_cancelled(e.id, now=self.now)
        if e.lifecycle != CANCELLING or e.state == LOCKED:
            assert finished is False
        elif e.kind == "workflow" and self.unfinished_children(e):
            assert finished is False
        else:
            assert finished is True
            self.m_finish(e, rk_failure("cancelled"), fenced=False)

    @precondition(lambda self: self.execs)
    @rule(index=INDEX, pause=st.booleans())
    def pause_or_unpause(self, index, pause):
        if pause:
            self.pause(index)
        else:
            self.unpause(index)

    def pause(self, index):
        e = self.pick(index, lambda e: True)

        def call():
            return store.pause_execution(e.id, now=self.now)

        if e.state == FINISHED:
            self.unchanged(errors.AlreadyFinished, call)
        elif e.lifecycle != ACTIVE or (e.state == LOCKED and e.kind == "activity"):
            self.unchanged(errors.IllegalState, call)
        else:
            version = call()
            if e.state == LOCKED:  # a running workflow is unlocked first, its run fenced out
                self.m_revoke(e, fenced=False)
                e.append("unlocked")
                self.m_to_pending(e, self.now)
            e.append("paused")
            e.lifecycle = PAUSED
            assert version == e.version + 1

    def unpause(self, index):
        e = self.pick(index, lambda e: True)

        def call():
            return store.unpause_execution(e.id, now=self.now)

        if e.state == FINISHED:
            self.unchanged(errors.AlreadyFinished, call)
        elif e.lifecycle != PAUSED:
            self.unchanged(errors.IllegalState, call)
        else:
            assert call() == e.version + 2
            e.append("unpaused")
            e.lifecycle = ACTIVE

    # -- workflows: children, JoinNext, responses (spec 000 §5.2, §6.4; D10; decision 9) -----

    @precondition(lambda self: self.any_exec(lambda e: e.kind == "workflow" and e.state == LOCKED))
    @rule(index=INDEX, new_join_set=st.booleans(), params=PARAMS)
    def spawn_child(self, index, new_join_set, params):
        self.append_child(index, new_join_set, params)

    def append_child(self, index, new_join_set, params) -> tuple[Model, str]:
        """The workflow's run submits a child activity (JoinSetCreate when the join set is
        new, then JoinSetRequest), creating the child in the same transaction."""
        wf = self.pick(index, lambda e: e.kind == "workflow" and e.state == LOCKED)
        events = []
        if new_join_set or not wf.join_sets:
            join_set = f"n:js{len(wf.join_sets) + 1}"
            events.append(history(JoinSetCreate(join_set_id=join_set)))
            wf.join_sets[join_set] = 0
        else:
            join_set = sorted(wf.join_sets)[index % len(wf.join_sets)]
        child_id = str(ExecutionId.parse(wf.id).child(JoinSetId.parse(join_set), wf.join_sets[join_set] + 1))
        request = ChildExecutionRequest(child_execution_id=child_id, target_ffqn=FFQN, params=params)
        events.append(history(JoinSetRequest(join_set_id=join_set, request=request)))
        child = self.request("activity", child_id, params, parent=(wf.id, join_set))
        version = store.append_batch_create_new_execution(
            wf.id, wf.version + 1, events, [child], fence=wf.fence, now=self.now
        )
        wf.join_sets[join_set] += 1
        for _ in events:
            wf.append("history_event")
        self.new_model("activity", child_id, params, parent=(wf.id, join_set))
        assert version == wf.version + 1
        return wf, join_set

    @precondition(
        lambda self: self.any_exec(
            lambda e: e.state == LOCKED and any(e.join_nexts.get(js, 0) < n for js, n in e.join_sets.items())
        )
    )
    @rule(index=INDEX)
    def join_next(self, index):
        wf = self.pick(
            index, lambda e: e.state == LOCKED and any(e.join_nexts.get(js, 0) < n for js, n in e.join_sets.items())
        )
        join_set = sorted(js for js, n in wf.join_sets.items() if wf.join_nexts.get(js, 0) < n)[0]
        self.append_join_next(wf, join_set)

    @precondition(lambda self: self.any_exec(lambda e: e.kind == "workflow" and e.state == LOCKED))
    @rule(index=INDEX, params=PARAMS)
    def workflow_awaits_a_new_child(self, index, params):
        """What a workflow's run does most: submit a child in a new join set and wait for it."""
        wf, join_set = self.append_child(index, True, params)
        self.append_join_next(wf, join_set)

    def append_join_next(self, wf: Model, join_set: str) -> None:
        """Spec 000 §5.2 JoinNext: pending at max(run expiry, the response's time) when the
        n-th response of the join set is there (decision 9), otherwise blocked on it."""
        run_expires_at = wf.at
        event = history(JoinNext(join_set_id=join_set, run_expires_at=run_expires_at))
        version = store.append(wf.id, None, event, fence=wf.fence, now=self.now)
        wf.append("history_event")
        nth = wf.join_nexts[join_set] = wf.join_nexts.get(join_set, 0) + 1
        answers = [at for js, _, at in wf.responses if js == join_set]
        if len(answers) >= nth:  # the n-th response is there: pending, the holder kept
            self.m_to_pending(wf, max(run_expires_at, answers[nth - 1]))
        else:
            wf.state, wf.at, wf.blocked_on = BLOCKED, run_expires_at, join_set
            wf.retry = wf.last_lock_version = None
        assert version == wf.version + 1

    @precondition(
        lambda self: self.any_exec(
            lambda e: e.parent and e.state == PENDING and e.lifecycle == ACTIVE and e.at <= self.now
        )
    )
    @rule(index=INDEX, value=PARAMS, group_commit=st.booleans())
    def worker_runs_a_child(self, index, value, group_commit=False):
        """A worker locks a due child and finishes it: its response reaches the parent (D10).
        As an executor does, or with its group commit (``append_many``), which on PostgreSQL
        outside a transaction is one statement (D81)."""
        e = self.pick(index, lambda e: e.parent and e.state == PENDING and e.lifecycle == ACTIVE and e.at <= self.now)
        who = self.new_run()
        locked = store.lock_one(
            e.id, e.version + 1, TERMS, executor_id=who[0], run_id=who[1], deployment_id=DEPLOYMENT, now=self.now
        )
        self.m_lock(e, who, TERMS, new=True)
        assert locked.fence == e.fence
        if group_commit:
            item = store.AppendItem(e.id, None, Finished(retval=Ok(value)), e.fence)
            assert store.append_many([item], now=self.now) == [e.version + 1]
        else:
            assert store.append(e.id, None, Finished(retval=Ok(value)), fence=e.fence, now=self.now) == e.version + 1
        self.m_finish(e, RK_OK, fenced=True, retval=("ok", exact(value)))

    # -- what must hold after every step --------------------------------------------------

    @invariant()
    def store_agrees_with_model(self):
        """Every execution's row and event variants (one bulk read), and for the executions
        the step touched the full ``store.get``: events, responses and exact parameters."""
        rows = {row.execution_id: row for row in ExecutionState.objects.all()}
        assert set(rows) == set(self.execs)
        variants = defaultdict(list)
        for execution_id, variant in ExecutionEvent.objects.order_by("execution_id", "version").values_list(
            "execution_id", "variant"
        ):
            variants[execution_id].append(variant)
        for e in self.execs.values():
            assert observed_row(rows[e.id], variants[e.id]) == expected_row(e), e.id
        cancelling = {(e.id, e.kind) for e in self.execs.values() if e.lifecycle == CANCELLING}
        assert set(store.get_cancelling(limit=1000)) == cancelling
        for execution_id in sorted(self.touched):
            e, log = self.execs[execution_id], store.get(execution_id)
            assert observed_row(log.state, [r.event.VARIANT for r in log.events]) == expected_row(e), e.id
            assert [(r.join_set_id, r.child_execution_id) for r in log.responses] == [
                (js, child) for js, child, _ in e.responses
            ], e.id
            assert exact(log.events[0].event.params) == exact(e.params), e.id
            # Results round-trip exactly (decision 15), and a child's response carries its
            # result, read from the child's Finished event (spec 000 §6.6, D10).
            if e.state == FINISHED:
                assert retval_of(store.get_finished_result(e.id)) == e.retval, e.id
            assert [retval_of(r.child_retval) for r in log.responses] == [
                self.execs[child].retval for _, child, _ in e.responses
            ], e.id
        self.touched.clear()


def test_store_behaves_like_its_specification_model():
    """Random sequences of store operations leave the store exactly where the model of
    spec 000 + decisions says: state, lifecycle, versions, lock generation, holder, times,
    failure count, result, events, responses and the exact parameters."""
    _run_machine(examples=50, steps=50)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_store_outside_a_transaction_behaves_like_its_specification_model():
    """The same machine with every operation as its own transaction, as workers call the
    store: on PostgreSQL a claim of activities and a group commit of runs' results are then
    one statement each (D69, D70, D81) instead of the transaction the test above runs them
    in, and must leave the store where the model says."""
    _run_machine(examples=25, steps=40)


def _run_machine(*, examples: int, steps: int) -> None:
    run_state_machine_as_test(
        StoreMachine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


# ---------------------------------------------------------------------------------------
# Scripted runs of the same machine: the paths random runs reach only sometimes, every time
# ---------------------------------------------------------------------------------------


def play(*steps) -> None:
    """Run ``(target, rule, arguments)`` steps on a fresh machine and compare store and model
    after each; ``target`` is an execution's creation index (0: the activity and 1: the
    workflow of ``one_of_each``, then in creation order), a step may also be a check of the
    model (so the script provably took the path it is named after)."""
    machine = StoreMachine()
    try:
        machine.one_of_each(activity_params=[1e16], workflow_params=[-0.0])
        machine.store_agrees_with_model()
        for step in steps:
            if callable(step):
                step(machine)
                continue
            target, name, kwargs = step
            machine.forced = None if target is None else list(machine.execs)[target]
            getattr(machine, name)(**{"index": 0, **kwargs} if target is not None else kwargs)
            machine.forced = None
            machine.store_agrees_with_model()
    finally:
        machine.teardown()


def model_of(target: int, **expected):
    def check(machine: StoreMachine) -> None:
        e = list(machine.execs.values())[target]
        assert {key: getattr(e, key) for key in expected} == expected

    return check


A, W, CHILD, CHILD2 = 0, 1, 2, 3


def test_cancelling_workflow_with_running_child_waits_for_it_in_the_model_run():
    """Contract item 9 / D26: the sweep gives a cancelling workflow whose child still runs
    ``Unlocked``; the driver finishes it only once the child has finished."""
    play(
        (None, "lock_pending", {"terms": TERMS}),
        (W, "spawn_child", {"new_join_set": True, "params": []}),
        (W, "cancel", {"running_parent": True}),
        (None, "sweep", {"seconds": 11}),
        model_of(W, state=PENDING, lifecycle=CANCELLING, holder=None),
        (W, "cancellation_driver", {}),
        model_of(W, state=PENDING, lifecycle=CANCELLING),
        (CHILD, "worker_runs_a_child", {"value": [1e300]}),
        (W, "cancellation_driver", {}),
        model_of(W, state=FINISHED, result_kind=rk_failure("cancelled")),
        (W, "cancel", {"running_parent": False}),
    )


def test_join_next_finds_an_early_response_and_relocks_by_the_last_holder_in_the_model_run():
    """Decision 9 (a JoinNext finds the n-th response already there), keep-warm and contract
    item 10 (a due row re-locked by its last holder gets a new generation)."""
    play(
        (None, "lock_pending", {"terms": TERMS}),
        (W, "spawn_child", {"new_join_set": True, "params": [{"b": 1, "a": 2}]}),
        (CHILD, "worker_runs_a_child", {"value": {"x": 1e16}}),
        (W, "join_next", {}),
        model_of(W, state=PENDING, generation=1),  # answered: pending, not blocked
        (W, "lock_one", {"by_holder": True, "lockable": True, "terms": TERMS}),
        model_of(W, state=LOCKED, generation=1),  # keep-warm before due: same generation
        (W, "workflow_awaits_a_new_child", {"params": []}),
        model_of(W, state=BLOCKED),
        (None, "advance_clock", {"seconds": 1}),
        (CHILD2, "worker_runs_a_child", {"value": None}),
        model_of(W, state=PENDING),  # the response unblocked it
        (None, "advance_clock", {"seconds": 11}),
        (W, "lock_one", {"by_holder": True, "lockable": True, "terms": TERMS}),
        model_of(W, state=LOCKED, generation=2),  # due: a new lock, even for the last holder
        (W, "holder_appends", {"what": "ok", "explicit_version": True, "value": [-0.0]}),
    )


def test_retries_run_out_on_lock_expiry_and_on_failed_attempts_in_the_model_run():
    """Spec 000 §10 / D12 / D30: expired locks and failed attempts use retries until none
    are left; then the execution finishes (timed out, or the attempt's final result)."""
    play(
        (None, "lock_pending", {"terms": ONE_RETRY}),
        (None, "advance_clock", {"seconds": 5}),
        (W, "extend_lock_by_holder", {}),  # a heartbeat: the workflow's lock now ends at +15 s
        (None, "sweep", {"seconds": 6}),  # the activity's lock expired, the workflow's not
        model_of(A, state=PENDING, intermittent=1),
        model_of(W, state=LOCKED, intermittent=0),
        (None, "sweep", {"seconds": 1}),
        (A, "lock_one", {"by_holder": False, "lockable": True, "terms": ONE_RETRY}),
        (None, "sweep", {"seconds": 11}),
        model_of(A, state=FINISHED, result_kind=rk_failure("timed_out")),
        (None, "lock_pending", {"terms": ONE_RETRY}),
        (W, "holder_appends", {"what": "attempt_failed", "explicit_version": False, "value": []}),
        model_of(W, state=PENDING, intermittent=2),  # workflows retry forever
        (
            None,
            "create",
            {
                "how": "new",
                "kind": "activity",
                "params": [5e-324],
                "paused": False,
                "later": 0,
                "index": 0,
                "flag": False,
                "existing": "none",
            },
        ),  # fmt: skip
        (None, "lock_pending", {"terms": ONE_RETRY}),
        (2, "holder_appends", {"what": "attempt_failed", "explicit_version": True, "value": []}),
        (None, "advance_clock", {"seconds": 1}),
        (None, "lock_pending", {"terms": ONE_RETRY}),
        (2, "holder_appends", {"what": "attempt_failed", "explicit_version": False, "value": []}),
        model_of(2, state=FINISHED, result_kind=rk_failure("uncategorized")),
        (2, "stale_fence_writes", {"what": "ok"}),
    )


def test_create_is_idempotent_exact_and_all_or_nothing_in_the_model_run():
    """Decision 13/15, contract items 7 and 8: identical creates (1e16, -0.0, key order)
    return the existing execution, a twin value conflicts, ``create_many`` with one
    conflicting request creates nothing."""
    play(
        (A, "create_again", {"params": None, "same": True, "other_kind": False}),
        (A, "create_again", {"params": [10000000000000000], "same": False, "other_kind": False}),
        (W, "create_again", {"params": [0.0], "same": False, "other_kind": False}),
        (A, "create_many", {"new": 3, "existing": "conflicting"}),
        (A, "create_many", {"new": 2, "existing": "identical"}),
        lambda machine: assert_count(machine, 4),
    )


def assert_count(machine: StoreMachine, n: int) -> None:
    assert len(machine.execs) == n
