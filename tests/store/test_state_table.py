"""Conformance of ``store.append`` to the state machine of spec 000 §5.2, §6.3 and §6.5.

Every event kind of ``state_machine.EVENT_KINDS`` is appended to a real execution in every
state pair of ``state_machine.VALID_STATES``. Executions reach their state only through the
store API. ``EXPECTED`` below is written by hand from the spec (§5.2 transition table and
error messages, §6.3 ``can_append_lock``, §6.5 UPDATE shapes, §12 invariants, and the
decisions in spec/README.md); it is *not* computed from ``state_machine.decide``. One
separate test checks that ``decide`` agrees with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest

from executions import errors, state_machine, store
from executions.events import (
    CancellationRequested,
    ChildExecutionRequest,
    ComponentId,
    ComponentUpgradeFinished,
    Created,
    DelayRequest,
    Finished,
    JoinNext,
    JoinNextTooMany,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Locked,
    Ok,
    Paused,
    Persist,
    Rescheduled,
    RetryConfig,
    Schedule,
    Stub,
    TemporarilyFailed,
    TemporarilyTimedOut,
    Unlocked,
    Unpaused,
)
from executions.ids import DelayId, ExecutionId, JoinSetId, content_digest, new_executor_id, new_run_id
from executions.models import Delay, ExecutionState
from executions.state_machine import Effect
from tests.support import helpers
from tests.support.helpers import DEPLOYMENT, FFQN, T0, WORKFLOW

pytestmark = pytest.mark.django_db

T1 = T0 + timedelta(seconds=5)  # when the event under test is appended
STATE_TERMS = store.LockTerms(
    WORKFLOW, RetryConfig(max_retries=5, retry_exp_backoff=timedelta(seconds=2)), timedelta(seconds=10)
)
DEPLOYMENT_2 = "Dep_01JBBBBBBBBBBBBBBBBBBBBBBB"
WORKFLOW_V2 = ComponentId(
    component_type="workflow", name="test_workflows", component_digest=content_digest(b"workflows v2")
)
MANUAL_UPGRADE = {"type": "success", "reason": {"type": "manual", "force": False}}

PENDING, LOCKED, BLOCKED, FINISHED = "pending_at", "locked", "blocked_by_join_set", "finished"


# ---------------------------------------------------------------------------------------
# The nine starting states, reached through the store API only
# ---------------------------------------------------------------------------------------


def _pending() -> str:
    return helpers.create_workflow(now=T0)


def _locked() -> str:
    execution_id = _pending()
    helpers.lock(execution_id, now=T0, terms=STATE_TERMS)
    return execution_id


def _blocked() -> str:
    execution_id = _pending()
    locked = helpers.lock(execution_id, now=T0, terms=STATE_TERMS)
    helpers.block_on_child(execution_id, locked, now=T0)
    return execution_id


def _paused(make):
    def build() -> str:
        execution_id = make()
        store.pause_execution(execution_id, now=T0)
        return execution_id

    return build


def _cancelling(make):
    def build() -> str:
        execution_id = make()
        assert store.cancel(execution_id, now=T0) == store.CancelOutcome.REQUESTED
        return execution_id

    return build


def _finished() -> str:
    execution_id = _pending()
    locked = helpers.lock(execution_id, now=T0, terms=STATE_TERMS)
    store.append(execution_id, locked.next_version, Finished(retval=Ok(0)), fence=locked.fence, now=T0)
    return execution_id


# column -> (builder, state, lifecycle)
STATES = {
    "pending": (_pending, PENDING, "active"),
    "locked": (_locked, LOCKED, "active"),
    "blocked": (_blocked, BLOCKED, "active"),
    "pending/paused": (_paused(_pending), PENDING, "paused"),
    "blocked/paused": (_paused(_blocked), BLOCKED, "paused"),
    "pending/cancelling": (_cancelling(_pending), PENDING, "cancelling"),
    "locked/cancelling": (_cancelling(_locked), LOCKED, "cancelling"),
    "blocked/cancelling": (_cancelling(_blocked), BLOCKED, "cancelling"),
    "finished": (_finished, FINISHED, "active"),
}
COLUMNS = tuple(STATES)


# ---------------------------------------------------------------------------------------
# The expected table (spec 000 §5.2, §6.3, §6.5; README decisions 12 and 14)
# ---------------------------------------------------------------------------------------

# Accepted: how the t_state row changes (the §6.5 shape in brackets).
LOCK_NEW = "locked, new lock"  # [C] lock_generation + 1
LOCK_EXTEND = "locked, extended"  # [C] same holder: lock_generation kept
TO_PENDING = "pending_at, +0"  # [A] at unlocked_at
RETRY = "pending_at, +1"  # [A] at backoff_expires_at, intermittent_event_count + 1
BLOCK = "blocked"  # [D] no response yet for the join set
DELAY = "bump + t_delay"  # [J] plus the t_delay row
BUMP = "bump"  # [J]
UPGRADE = "upgrade"  # [H]
PAUSE = "lifecycle paused"  # [F]
UNPAUSE = "lifecycle active"  # [F]
CANCEL = "lifecycle cancelling"  # [G]
FINISH = "finished"  # [E] returns the same version
RESCHEDULE = "pending_at, new due time"  # an operator's "run now" (decisions.md D54)


@dataclass(frozen=True)
class Rejected:
    error: type[errors.StoreError]
    message: str | None = None  # for UnlockedCannotBeAppended: the state word


FIN = Rejected(errors.AlreadyFinished)  # §6.2 step 4 (no message in the spec)
CREATED = Rejected(errors.ValidationFailed, "cannot append `Created` event - use `create` instead")
LOCK_BLOCKED = Rejected(errors.IllegalState, "cannot append Locked event when in BlockedByJoinSet state")
LOCK_PAUSED = Rejected(errors.IllegalState, "cannot lock, execution is paused")
LOCK_CANCELLING = Rejected(errors.IllegalState, "cannot lock, execution is cancelling")
LOCK_FINISHED = Rejected(errors.IllegalState, "already finished")
PAUSE_LOCKED = Rejected(errors.IllegalState, "cannot append Paused event when execution is locked; use pause_execution")
PAUSE_PAUSED = Rejected(errors.IllegalState, "cannot pause, execution is already paused")
PAUSE_CANCELLING = Rejected(errors.IllegalState, "cannot pause, execution is cancelling")
NOT_PAUSED = Rejected(errors.IllegalState, "cannot unpause, execution is not paused")
CANCELLING_AGAIN = Rejected(
    errors.IllegalState, "cannot append CancellationRequested event, execution is already cancelling"
)


NOT_RESCHEDULABLE = Rejected(errors.IllegalState, "only a pending, active execution can be rescheduled")


def not_unlockable(state: str) -> Rejected:
    return Rejected(errors.UnlockedCannotBeAppended, state)


# fmt: off
EXPECTED = {
    # columns:                   pending            locked                      blocked                     pending/paused      blocked/paused       pending/cancelling   locked/cancelling    blocked/cancelling   finished
    "created":                   [CREATED,          CREATED,                    CREATED,                    CREATED,            CREATED,             CREATED,             CREATED,             CREATED,             CREATED],
    "locked":                    [LOCK_NEW,         LOCK_EXTEND,                LOCK_BLOCKED,               LOCK_PAUSED,        LOCK_PAUSED,         LOCK_CANCELLING,     LOCK_CANCELLING,     LOCK_CANCELLING,     LOCK_FINISHED],
    # locked/cancelling: the sweep unlocks an expired cancelling workflow whose children still run (D26)
    "unlocked":                  [not_unlockable("pending"), TO_PENDING,        not_unlockable("blocked"),  not_unlockable("paused"), not_unlockable("paused"), not_unlockable("cancelling"), TO_PENDING,          not_unlockable("cancelling"), FIN],
    "temporarily_failed":        [RETRY,            RETRY,                      RETRY,                      RETRY,              RETRY,               RETRY,               RETRY,               RETRY,               FIN],
    "temporarily_timed_out":     [RETRY,            RETRY,                      RETRY,                      RETRY,              RETRY,               RETRY,               RETRY,               RETRY,               FIN],
    "finished":                  [FINISH,           FINISH,                     FINISH,                     FINISH,             FINISH,              FINISH,              FINISH,              FINISH,              FIN],
    "component_upgrade_finished": [UPGRADE,         UPGRADE,                    UPGRADE,                    UPGRADE,            UPGRADE,             UPGRADE,             UPGRADE,             UPGRADE,             FIN],
    "paused":                    [PAUSE,            PAUSE_LOCKED,               PAUSE,                      PAUSE_PAUSED,       PAUSE_PAUSED,        PAUSE_CANCELLING,    PAUSE_CANCELLING,    PAUSE_CANCELLING,    FIN],
    "unpaused":                  [NOT_PAUSED,       NOT_PAUSED,                 NOT_PAUSED,                 UNPAUSE,            UNPAUSE,             NOT_PAUSED,          NOT_PAUSED,          NOT_PAUSED,          FIN],
    "cancellation_requested":    [CANCEL,           CANCEL,                     CANCEL,                     CANCEL,             CANCEL,              CANCELLING_AGAIN,    CANCELLING_AGAIN,    CANCELLING_AGAIN,    FIN],
    "rescheduled":               [RESCHEDULE,       NOT_RESCHEDULABLE,          NOT_RESCHEDULABLE,          NOT_RESCHEDULABLE,  NOT_RESCHEDULABLE,   NOT_RESCHEDULABLE,   NOT_RESCHEDULABLE,   NOT_RESCHEDULABLE,   FIN],
    "history_event:join_next":   [BLOCK,            BLOCK,                      BLOCK,                      BLOCK,              BLOCK,               BLOCK,               BLOCK,               BLOCK,               FIN],
    "history_event:delay_request": [DELAY,          DELAY,                      DELAY,                      DELAY,              DELAY,               DELAY,               DELAY,               DELAY,               FIN],
    "history_event":             [BUMP,             BUMP,                       BUMP,                       BUMP,               BUMP,                BUMP,                BUMP,                BUMP,                FIN],
}
# fmt: on

CELLS = [(kind, column, EXPECTED[kind][i]) for kind in EXPECTED for i, column in enumerate(COLUMNS)]
CELL_IDS = [f"{kind}-from-{column}" for kind, column, _ in CELLS]

# Times written by the events under test.
LOCK_EXPIRES = T1 + timedelta(seconds=30)
UNLOCKED_AT = T1 + timedelta(seconds=1)
BACKOFF_EXPIRES = T1 + timedelta(seconds=2)
RUN_EXPIRES = T1 + timedelta(seconds=3)
DELAY_EXPIRES = T1 + timedelta(seconds=4)
NEW_RETRY = RetryConfig(max_retries=1, retry_exp_backoff=timedelta(seconds=3))


def _delay_id(execution_id: str) -> str:
    return str(DelayId(ExecutionId.parse(execution_id), JoinSetId("n", "timer"), 1))


def make_event(kind: str, row: ExecutionState):
    """One event of ``kind`` for ``row``. ``Locked`` reuses the row's holder when it has one
    (the most permissive attempt: an extension), otherwise it is a new executor and run."""
    history = helpers.history
    if kind == "created":
        return Created(ffqn=FFQN, params=[], scheduled_at=T1, component_id=WORKFLOW, deployment_id=DEPLOYMENT)
    if kind == "locked":
        return Locked(
            component_id=WORKFLOW_V2,
            executor_id=row.executor_id or new_executor_id(),
            deployment_id=DEPLOYMENT_2,
            run_id=row.run_id or new_run_id(),
            lock_expires_at=LOCK_EXPIRES,
            retry_config=NEW_RETRY,
        )
    return {
        "unlocked": lambda: Unlocked(unlocked_at=UNLOCKED_AT, reason="test"),
        "temporarily_failed": lambda: TemporarilyFailed(backoff_expires_at=BACKOFF_EXPIRES, reason="boom"),
        "temporarily_timed_out": lambda: TemporarilyTimedOut(backoff_expires_at=BACKOFF_EXPIRES),
        "finished": lambda: Finished(retval=Ok(7)),
        "component_upgrade_finished": lambda: ComponentUpgradeFinished(
            component_digest=WORKFLOW_V2.component_digest, deployment_id=DEPLOYMENT_2, outcome=MANUAL_UPGRADE
        ),
        "paused": Paused,
        "unpaused": Unpaused,
        "cancellation_requested": CancellationRequested,
        "rescheduled": lambda: Rescheduled(scheduled_at=UNLOCKED_AT),
        "history_event:join_next": lambda: history(
            JoinNext(join_set_id="n:next", run_expires_at=RUN_EXPIRES, closing=True)
        ),
        "history_event:delay_request": lambda: history(
            JoinSetRequest(
                join_set_id="n:timer",
                request=DelayRequest(delay_id=_delay_id(row.execution_id), expires_at=DELAY_EXPIRES),
            )
        ),
        "history_event": lambda: history(Persist(value=[7], kind={"type": "random_u64", "min": 0, "max_inclusive": 9})),
    }[kind]()


def _to_pending(row: dict, at) -> None:  # §6.5 A (executor_id/run_id kept)
    row.update(
        state=PENDING, pending_expires_finished=at, max_retries=None, retry_exp_backoff_millis=None,
        last_lock_version=None, join_set_id=None, join_set_closing=None, result_kind=None,
    )  # fmt: skip


def expected_row(outcome: str, before: dict, event, version: int) -> dict:
    """The t_state row after an accepted event, from the SET lists of spec 000 §6.5."""
    row = dict(before, corresponding_version=version)
    # An event written without the holder's fence that moves the row out of `locked`
    # revokes the lock: lock_generation + 1 and the holder is forgotten (docs/decisions.md),
    # so the old run can neither write nor extend.
    if before["state"] == LOCKED and outcome in (TO_PENDING, RETRY, BLOCK, FINISH):
        row.update(lock_generation=row["lock_generation"] + 1, executor_id=None, run_id=None)
    if outcome in (LOCK_NEW, LOCK_EXTEND):
        row.update(
            state=LOCKED, pending_expires_finished=event.lock_expires_at, last_lock_version=version,
            executor_id=event.executor_id, run_id=event.run_id, deployment_id=event.deployment_id,
            component_id_input_digest=event.component_id.component_digest,
            max_retries=event.retry_config.max_retries,
            retry_exp_backoff_millis=event.retry_config.retry_exp_backoff // timedelta(milliseconds=1),
            join_set_id=None, join_set_closing=None, result_kind=None,
        )  # fmt: skip
        row["lock_generation"] += outcome == LOCK_NEW
    elif outcome == TO_PENDING:
        _to_pending(row, event.unlocked_at)
    elif outcome == RETRY:
        _to_pending(row, event.backoff_expires_at)
        row["intermittent_event_count"] += 1
    elif outcome == BLOCK:
        row.update(
            state=BLOCKED, pending_expires_finished=event.event.run_expires_at, join_set_id=event.event.join_set_id,
            join_set_closing=event.event.closing, max_retries=None, retry_exp_backoff_millis=None,
            last_lock_version=None, result_kind=None,
        )  # fmt: skip
    elif outcome == UPGRADE:
        row.update(
            component_id_input_digest=event.component_digest,
            deployment_id=event.deployment_id,
            incompatible_digest=None,
        )
    elif outcome == RESCHEDULE:
        row["pending_expires_finished"] = event.scheduled_at
    elif outcome in (PAUSE, UNPAUSE, CANCEL):
        row["lifecycle"] = {PAUSE: "paused", UNPAUSE: "active", CANCEL: "cancelling"}[outcome]
    elif outcome == FINISH:
        row.update(
            state=FINISHED, pending_expires_finished=T1, max_retries=None, retry_exp_backoff_millis=None,
            last_lock_version=None, executor_id=None, run_id=None, join_set_id=None, join_set_closing=None,
            lifecycle="active", result_kind='"ok"',
        )  # fmt: skip
    return row


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------


def row_of(execution_id: str) -> dict:
    row = ExecutionState.objects.filter(pk=execution_id).values().get()
    del row["updated_at"]
    return row


def assert_rejected(call, expected: Rejected) -> errors.StoreError:
    """``call`` raises exactly ``expected`` and writes nothing."""
    before = helpers.db_snapshot()
    with pytest.raises(errors.StoreError) as info:
        call()
    assert type(info.value) is expected.error, info.value
    if expected.error is errors.UnlockedCannotBeAppended:
        assert info.value.state == expected.message
    elif expected.message is not None:
        assert str(info.value) == expected.message
    assert helpers.db_snapshot() == before
    return info.value


def build(column: str) -> str:
    return STATES[column][0]()


# ---------------------------------------------------------------------------------------
# The table itself
# ---------------------------------------------------------------------------------------


def test_table_covers_every_event_kind_and_valid_state():
    assert list(EXPECTED) == list(state_machine.EVENT_KINDS)
    assert all(len(cells) == len(COLUMNS) for cells in EXPECTED.values())
    assert [(state, lifecycle) for _, state, lifecycle in STATES.values()] == [
        (str(state), str(lifecycle)) for state, lifecycle in state_machine.VALID_STATES
    ]


@pytest.mark.parametrize("column", COLUMNS)
def test_builders_reach_their_state(column):
    builder, state, lifecycle = STATES[column]
    row = store.get_state(builder())
    assert (row.state, row.lifecycle) == (state, lifecycle)


@pytest.mark.parametrize(("kind", "column", "outcome"), CELLS, ids=CELL_IDS)
def test_append(kind, column, outcome):
    execution_id = build(column)
    state = store.get_state(execution_id)
    event = make_event(kind, state)
    # A finished execution's next version is its Finished version (§4 get_next_version_or_finished).
    version = state.corresponding_version if state.is_finished else state.corresponding_version + 1
    if isinstance(outcome, Rejected):
        assert_rejected(lambda: store.append(execution_id, version, event, now=T1), outcome)
        return

    before, delays_before = row_of(execution_id), Delay.objects.count()
    variants_before = helpers.event_variants(execution_id)
    returned = store.append(execution_id, version, event, now=T1)

    assert returned == (version if outcome == FINISH else version + 1)  # §12.3
    assert row_of(execution_id) == expected_row(outcome, before, event, version)
    assert helpers.event_variants(execution_id) == variants_before + [event.VARIANT]
    logged = store.get_event(execution_id, version)
    assert logged.created_at == T1 and type(logged.event) is type(event)
    if outcome == DELAY:
        delay = Delay.objects.get(delay_id=_delay_id(execution_id))
        assert (delay.execution_id, delay.join_set_id, delay.expires_at, delay.is_paused) == (
            execution_id, "n:timer", DELAY_EXPIRES, False,
        )  # fmt: skip
    else:
        assert Delay.objects.count() == delays_before


CODE_TO_EFFECT = {
    LOCK_NEW: Effect.LOCK,
    LOCK_EXTEND: Effect.LOCK,
    TO_PENDING: Effect.TO_PENDING,
    RETRY: Effect.RETRY,
    BLOCK: Effect.JOIN_NEXT,
    DELAY: Effect.DELAY,
    BUMP: Effect.BUMP,
    UPGRADE: Effect.UPGRADE,
    PAUSE: Effect.PAUSE,
    UNPAUSE: Effect.UNPAUSE,
    CANCEL: Effect.CANCEL,
    FINISH: Effect.FINISH,
    RESCHEDULE: Effect.RESCHEDULE,
}


def test_decide_agrees_with_the_table():
    disagreements = []
    for kind, column, outcome in CELLS:
        _, state, lifecycle = STATES[column]
        try:
            got = state_machine.decide(kind, state, lifecycle)
        except errors.StoreError as error:
            got = Rejected(
                type(error), error.state if isinstance(error, errors.UnlockedCannotBeAppended) else str(error)
            )
        want = CODE_TO_EFFECT.get(outcome, outcome)
        if isinstance(want, Rejected) and want.message is None and isinstance(got, Rejected):
            got = Rejected(got.error)
        if got != want:
            disagreements.append(f"{kind} from {column}: decide says {got}, the spec says {want}")
    assert not disagreements, "\n".join(disagreements)


def test_architecture_doc_shows_the_matrix():
    doc = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
    if not doc.exists():
        pytest.skip("docs/architecture.md does not exist yet")
    assert state_machine.transition_matrix_markdown() in doc.read_text()


# ---------------------------------------------------------------------------------------
# The Locked guards (§6.3 can_append_lock, §10 lock extension, decision 12)
# ---------------------------------------------------------------------------------------


def test_new_lock_before_scheduled_at_is_not_yet_pending():
    execution_id = helpers.create_workflow(now=T0, scheduled_at=T0 + timedelta(hours=1))
    assert_rejected(
        lambda: helpers.lock(execution_id, now=T0 + timedelta(minutes=59)),
        Rejected(errors.ValidationFailed, "cannot lock, not yet pending"),
    )
    assert helpers.lock(execution_id, now=T0 + timedelta(hours=1)).next_version == 2


# §6.3: the expiry check comes first, for every state (§5.1: "or ValidationFailed for a bad
# expiry" on a finished execution too).


@pytest.mark.parametrize(
    "column",
    [
        "pending",
        "locked",
        "blocked",
        "pending/paused",
        "locked/cancelling",
        "finished",
    ],
)
@pytest.mark.parametrize("expires_after", [timedelta(0), -timedelta(seconds=1)], ids=["equal", "before"])
def test_lock_expiry_not_after_created_at_is_invalid(column, expires_after):
    execution_id = build(column)
    row = store.get_state(execution_id)
    event = make_event("locked", row).model_copy(update={"lock_expires_at": T1 + expires_after})
    assert_rejected(
        lambda: store.append(execution_id, row.next_version, event, now=T1),
        Rejected(errors.ValidationFailed, "invalid expiry date"),
    )


def test_holder_extends_its_lock_keeping_the_generation():
    execution_id = helpers.create_workflow(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    generation = store.get_state(execution_id).lock_generation
    assert generation == locked.fence.lock_generation == 1
    # Even after the lock ran out, as long as no sweep handled it (decision 12).
    later = T0 + timedelta(minutes=5)
    event = locked.locked.model_copy(update={"lock_expires_at": later + timedelta(seconds=10)})
    assert store.append(execution_id, 2, event, now=later) == 3
    row = store.get_state(execution_id)
    assert (row.state, row.lock_generation, row.last_lock_version) == (LOCKED, generation, 2)
    assert row.pending_expires_finished == later + timedelta(seconds=10)
    # The holder's fence still holds.
    assert store.append(execution_id, 3, Finished(retval=Ok(1)), fence=locked.fence, now=later) == 3


def test_another_run_cannot_lock_a_locked_execution_even_after_expiry():
    execution_id = helpers.create_workflow(now=T0)
    helpers.lock(execution_id, now=T0)
    for now in (T0 + timedelta(seconds=1), T0 + timedelta(hours=1)):
        assert_rejected(
            lambda now=now: helpers.lock(execution_id, now=now),
            Rejected(errors.IllegalState, "cannot lock, already locked"),
        )
    # Same executor, different run: still another lock.
    executor_id = store.get_state(execution_id).executor_id
    assert_rejected(
        lambda: helpers.lock(execution_id, now=T0 + timedelta(seconds=1), executor_id=executor_id),
        Rejected(errors.IllegalState, "cannot lock, already locked"),
    )


def test_keep_warm_holder_extends_from_pending_before_scheduled_at():
    """§10 "keep warm": blocked → response → pending at max(run_expires_at, response time);
    the holder may lock again before that time, keeping its generation; nobody else can."""
    execution_id = helpers.create_workflow(now=T0)
    locked = helpers.lock(execution_id, now=T0, terms=STATE_TERMS)  # lock expires T0+10s
    _, child, _ = helpers.block_on_child(execution_id, locked, now=T0)
    store.append(child, 1, Finished(retval=Ok("child")), now=T0 + timedelta(seconds=2))
    row = store.get_state(execution_id)
    assert (row.state, row.pending_expires_finished) == (PENDING, T0 + timedelta(seconds=10))
    assert (row.executor_id, row.run_id) == (locked.locked.executor_id, locked.locked.run_id)

    early = T0 + timedelta(seconds=3)
    assert_rejected(
        lambda: helpers.lock(execution_id, now=early),
        Rejected(errors.ValidationFailed, "cannot lock, not yet pending"),
    )
    again = helpers.lock(
        execution_id, now=early, terms=STATE_TERMS, executor_id=locked.locked.executor_id, run_id=locked.locked.run_id
    )
    row = store.get_state(execution_id)
    assert (row.state, row.lock_generation) == (LOCKED, locked.fence.lock_generation)
    assert again.fence == locked.fence


def test_another_run_locks_once_pending_is_due_with_a_new_generation():
    execution_id = helpers.create_workflow(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    store.append(
        execution_id, 2, Unlocked(unlocked_at=T0 + timedelta(minutes=1), reason="yield"), fence=locked.fence, now=T0
    )
    assert store.get_state(execution_id).lock_generation == 1  # the holder's own unlock revokes nothing
    other = helpers.lock(execution_id, now=T0 + timedelta(minutes=1))
    assert other.fence.lock_generation == store.get_state(execution_id).lock_generation == 2
    with pytest.raises(errors.LockLost):
        store.append(execution_id, 4, Finished(retval=Ok(0)), fence=locked.fence, now=T0 + timedelta(minutes=1))


# ---------------------------------------------------------------------------------------
# Other transitions: Finished's version, JoinNext with a response, responses, upgrades
# ---------------------------------------------------------------------------------------


def test_finished_returns_its_own_version_and_ends_the_log():
    execution_id = helpers.create(now=T0)
    locked = helpers.lock(execution_id, now=T0)
    assert store.append(execution_id, 2, Finished(retval=Ok(None)), fence=locked.fence, now=T1) == 2
    row = store.get_state(execution_id)
    assert (row.corresponding_version, row.next_version) == (2, 2)
    for version in (2, 3):
        assert_rejected(
            lambda version=version: store.append(execution_id, version, Finished(retval=Ok(1)), now=T1), FIN
        )


def _locked_parent_with_answered_child(response_at):
    """A locked workflow whose child in ``n:js`` finished at ``response_at`` (parent not blocked)."""
    execution_id = helpers.create_workflow(now=T0)
    locked = helpers.lock(execution_id, now=T0, terms=STATE_TERMS)
    js = JoinSetId("n", "js")
    child = str(ExecutionId.parse(execution_id).child(js, 1))
    version = store.append_batch_create_new_execution(
        execution_id,
        locked.next_version,
        [
            helpers.history(JoinSetCreate(join_set_id=str(js))),
            helpers.history(
                JoinSetRequest(
                    join_set_id=str(js),
                    request=ChildExecutionRequest(child_execution_id=child, target_ffqn=FFQN, params=[]),
                )
            ),
        ],
        [
            store.CreateRequest(
                execution_id=child,
                ffqn=FFQN,
                params=[],
                component_id=helpers.ACTIVITY,
                deployment_id=DEPLOYMENT,
                parent=(execution_id, str(js)),
            )
        ],  # fmt: skip
        fence=locked.fence,
        now=T0,
    )
    store.append(child, 1, Finished(retval=Ok("child")), now=response_at)
    assert store.get_state(execution_id).state == LOCKED
    return execution_id, locked, version


@pytest.mark.parametrize(
    ("run_expires_after", "response_after", "pending_after"),
    [(30, 5, 30), (5, 30, 30), (10, 10, 10)],
    ids=["run-expires-later", "response-later", "same-time"],
)
def test_join_next_with_its_response_already_there_goes_pending(run_expires_after, response_after, pending_after):
    execution_id, locked, version = _locked_parent_with_answered_child(T0 + timedelta(seconds=response_after))
    join_next = JoinNext(join_set_id="n:js", run_expires_at=T0 + timedelta(seconds=run_expires_after))
    now = T0 + timedelta(seconds=1)
    assert store.append(execution_id, version, helpers.history(join_next), fence=locked.fence, now=now) == version + 1
    row = row_of(execution_id)
    assert (row["state"], row["lifecycle"], row["join_set_id"]) == (PENDING, "active", None)
    assert row["pending_expires_finished"] == T0 + timedelta(seconds=pending_after)
    assert row["intermittent_event_count"] == 0
    assert row["lock_generation"] == locked.fence.lock_generation  # the holder's own write


def test_second_join_next_waits_for_the_second_response():
    """§12.10: positional matching -- the n-th JoinNext consumes the n-th response."""
    execution_id, locked, version = _locked_parent_with_answered_child(T0 + timedelta(seconds=1))
    first = helpers.history(JoinNext(join_set_id="n:js", run_expires_at=T0 + timedelta(seconds=10)))
    version = store.append(execution_id, version, first, fence=locked.fence, now=T0 + timedelta(seconds=2))
    helpers.lock(execution_id, now=T0 + timedelta(seconds=3), terms=STATE_TERMS,
                 executor_id=locked.locked.executor_id, run_id=locked.locked.run_id)  # fmt: skip
    second = helpers.history(JoinNext(join_set_id="n:js", run_expires_at=T0 + timedelta(seconds=20)))
    store.append(execution_id, version + 1, second, fence=locked.fence, now=T0 + timedelta(seconds=4))
    row = row_of(execution_id)
    assert (row["state"], row["join_set_id"], row["pending_expires_finished"]) == (
        BLOCKED, "n:js", T0 + timedelta(seconds=20),
    )  # fmt: skip


def test_join_next_try_found_consumes_the_response():
    """Decision 9: a JoinNextTry that found a response counts like a JoinNext."""
    execution_id, locked, version = _locked_parent_with_answered_child(T0 + timedelta(seconds=1))
    found = helpers.history(JoinNextTry(join_set_id="n:js", outcome="found"))
    version = store.append(execution_id, version, found, fence=locked.fence, now=T0 + timedelta(seconds=2))
    assert store.get_state(execution_id).state == LOCKED
    join_next = helpers.history(JoinNext(join_set_id="n:js", run_expires_at=T0 + timedelta(seconds=10)))
    store.append(execution_id, version, join_next, fence=locked.fence, now=T0 + timedelta(seconds=3))
    assert store.get_state(execution_id).state == BLOCKED


@pytest.mark.parametrize(
    ("column", "after"),
    [
        ("blocked", (PENDING, "active")),
        ("blocked/paused", (PENDING, "paused")),
        ("blocked/cancelling", (BLOCKED, "cancelling")),
    ],
)
def test_child_response_unblocks_active_and_paused_but_not_cancelling(column, after):
    """§6.4 step 3 and §12.9; blocked at run_expires_at T0+10s, response later at T0+20s."""
    execution_id = build(column)
    before = row_of(execution_id)
    child_id = str(ExecutionId.parse(execution_id).child(JoinSetId("n", "js"), 1))
    store.append(child_id, 1, Finished(retval=Ok(1)), now=T0 + timedelta(seconds=20))
    row = row_of(execution_id)
    if after[0] == BLOCKED:
        assert row == before
        return
    expected = dict(before, lifecycle=after[1])  # a response appends no event: version kept (§12.2)
    _to_pending(expected, T0 + timedelta(seconds=20))
    assert row == expected


def test_failed_component_upgrade_records_the_incompatible_digest():
    execution_id = build("pending")
    before = row_of(execution_id)
    failed = ComponentUpgradeFinished(
        component_digest=WORKFLOW_V2.component_digest,
        deployment_id=DEPLOYMENT_2,
        outcome={"type": "failed", "reason": "x"},
    )
    assert store.append(execution_id, 1, failed, now=T1) == 2
    assert row_of(execution_id) == dict(
        before, corresponding_version=1, incompatible_digest=WORKFLOW_V2.component_digest
    )


def test_paused_delay_request_stores_a_paused_timer():
    execution_id = build("locked")
    request = DelayRequest(delay_id=_delay_id(execution_id), expires_at=DELAY_EXPIRES, paused=True)
    assert (
        store.append(execution_id, 2, helpers.history(JoinSetRequest(join_set_id="n:timer", request=request)), now=T1)
        == 3
    )
    assert Delay.objects.get(delay_id=request.delay_id).is_paused is True
    assert store.get_expired_timers(now=DELAY_EXPIRES)[0] == []  # §10: paused delays do not expire


HISTORY_EVENTS = {
    "join_set_create": lambda eid: JoinSetCreate(join_set_id="n:other"),
    "child_execution_request": lambda eid: JoinSetRequest(
        join_set_id="o:one",
        request=ChildExecutionRequest(
            child_execution_id=str(ExecutionId.parse(eid).child(JoinSetId("o", "one"), 1)), target_ffqn=FFQN, params=[]
        ),
    ),
    "persist": lambda eid: Persist(value=[1, 2], kind={"type": "execution_id"}),
    "schedule": lambda eid: Schedule(execution_id=str(ExecutionId.generate())),
    "stub": lambda eid: Stub(
        target_execution_id=str(ExecutionId.parse(eid).child(JoinSetId("o", "s"), 1)), retval_hash="01" + "0" * 64
    ),
    "join_next_too_many": lambda eid: JoinNextTooMany(join_set_id="n:js"),
    "join_next_try_pending": lambda eid: JoinNextTry(join_set_id="n:js", outcome="pending"),
}


@pytest.mark.parametrize("name", HISTORY_EVENTS)
@pytest.mark.parametrize("column", ["locked", "blocked/paused"])
def test_other_history_events_only_bump_the_version(column, name):
    execution_id = build(column)
    before = row_of(execution_id)
    event = helpers.history(HISTORY_EVENTS[name](execution_id))
    version = before["corresponding_version"] + 1
    assert store.append(execution_id, version, event, now=T1) == version + 1
    assert row_of(execution_id) == dict(before, corresponding_version=version)


# ---------------------------------------------------------------------------------------
# Which error wins (§6.2: finished first, then the version check, then the event's rule)
# ---------------------------------------------------------------------------------------


def test_finished_wins_over_a_stale_version():
    execution_id = build("finished")
    assert_rejected(lambda: store.append(execution_id, 1, Paused(), now=T1), FIN)


def test_stale_version_of_an_allowed_event_is_a_version_conflict():
    execution_id = build("locked")
    error = assert_rejected(
        lambda: store.append(execution_id, 1, Unlocked(unlocked_at=T1, reason="x"), now=T1),
        Rejected(errors.VersionConflict, "version conflict: expected 2, requested 1"),
    )
    assert (error.expected, error.requested) == (2, 1)


@pytest.mark.parametrize(
    ("column", "kind"),
    [
        ("pending", "unlocked"),
        ("locked", "paused"),
        ("pending", "unpaused"),
        ("pending/cancelling", "cancellation_requested"),
    ],
)
def test_stale_version_wins_over_the_events_precondition(column, kind):
    execution_id = build(column)
    row = store.get_state(execution_id)
    assert_rejected(
        lambda: store.append(execution_id, row.corresponding_version, make_event(kind, row), now=T1),
        Rejected(errors.VersionConflict),
    )
