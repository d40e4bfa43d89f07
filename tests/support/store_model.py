"""The model of the store's specification that ``tests/store/test_store_model.py`` compares
the real store with: the constants of spec 000 (states, result kinds, lock terms, values that
must round-trip exactly), ``Model`` (one execution as the specification says it must be),
``ModelledStore`` (the bookkeeping of a hypothesis state machine over it: ids, picking a
target, the model's transitions of spec 000 §5.2, §6.4, §6.5) and the rows the store must
hold for a model (``expected_row``) next to what it holds (``observed_row``).

Written from the specification and the decisions, never from the store's code.

why: D8, D10, D12 (revocation, child responses and retries the model computes itself)
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from executions import store
from executions.events import (
    Err,
    ExecutionFailure,
    Ok,
    RetryConfig,
)
from executions.models import (
    Delay,
    ExecutionBacktrace,
    ExecutionEvent,
    ExecutionState,
    JoinSetResponse,
    LogEntry,
)
from tests.support.helpers import (
    ACTIVITY,
    DEPLOYMENT,
    FFQN,
    T0,
    TERMS,
    WORKFLOW,
    WORKFLOW_FFQN,
    db_snapshot,
)

# ---------------------------------------------------------------------------------------
# Constants of the model, from the specification
# ---------------------------------------------------------------------------------------

PENDING, LOCKED, BLOCKED, FINISHED = "pending_at", "locked", "blocked_by_join_set", "finished"
ACTIVE, PAUSED, CANCELLING = "active", "paused", "cancelling"

# t_state.result_kind: the exact JSON of spec 000 §3.4 (decisions.md D4).
RK_OK = '"ok"'
RK_ERR = '{"err":"error"}'


def rk_failure(kind: str) -> str:
    return json.dumps({"err": {"execution_failure": kind}}, separators=(",", ":"))


# Lock terms (tests/support/helpers.py): activities retry 3 times from 1 s (or once, so that retries
# run out within a few steps), workflows forever with no back-off; every lock lasts 10 s.
ONE_RETRY = store.LockTerms(
    ACTIVITY, RetryConfig(max_retries=1, retry_exp_backoff=timedelta(seconds=1)), timedelta(seconds=10)
)
ACTIVITY_TERMS = st.sampled_from([TERMS, ONE_RETRY])
FFQN_OF = {"activity": FFQN, "workflow": WORKFLOW_FFQN}
COMPONENT_OF = {"activity": ACTIVITY, "workflow": WORKFLOW}
LOCK_DURATION = timedelta(seconds=10)


def same_params(a, b) -> bool:
    """Parameters are compared as a JSON Schema validator compares JSON values (D104):
    the oracle is ``const`` itself."""
    return Draft202012Validator({"const": a}).is_valid(b)


def exact(value) -> str:
    """What must read back identical (decision 15): the JSON text, key order included."""
    return json.dumps(value, ensure_ascii=False)


def retry_delay(count: int, max_retries: int | None, backoff: timedelta) -> timedelta | None:
    """Spec 000 §10: attempt ``count`` may run after ``backoff * 2^(count-1)`` while
    ``count <= max_retries`` (``None``: forever); otherwise there is no retry."""
    if max_retries is not None and count > max_retries:
        return None
    return backoff * (2 ** (count - 1))


# Values that must round-trip exactly (decision 15, contract item 7), with twins that
# differ from them as JSON text only (``1e16`` and its integer, ``-0.0`` and ``0.0``: equal
# values, so a create with the twin is idempotent, D104), and a pair that differs only in
# key order (also idempotent).
TRICKY_PARAMS = [
    [],
    [1e16],
    [10000000000000000],
    [-0.0],
    [0.0],
    [1e300],
    [5e-324],
    [1],
    [1.0],
    ['text with ünïcödé and "quotes" \\ and \u2028'],
    [{"b": 1, "a": [1.5, None, True]}],
    [{"a": [1.5, None, True], "b": 1}],
    [[[]], {}, ""],
]
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)
_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_json_values = st.recursive(
    _json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3), max_leaves=6
)
PARAMS = st.sampled_from(TRICKY_PARAMS) | st.lists(_json_values, max_size=3)
INDEX = st.integers(0, 10_000)


# ---------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------


@dataclass
class Model:
    """One execution as the specification says it must be."""

    id: str
    kind: str  # "activity" | "workflow"
    ffqn: str
    params: list
    parent: tuple[str, str] | None
    state: str
    lifecycle: str
    at: datetime  # pending: scheduled at; locked: lock expiry; blocked: run expiry; finished: finished at
    version: int = 0  # corresponding_version: the last event's version
    generation: int = 0
    holder: tuple[str, str] | None = None  # (executor_id, run_id)
    intermittent: int = 0
    result_kind: str | None = None
    retval: tuple | None = None  # ("ok"|"err", exact JSON of the value) or ("failure", kind)
    retry: tuple[int | None, timedelta] | None = None  # the lock's retry policy, while locked
    last_lock_version: int | None = None
    events: list[str] = field(default_factory=lambda: ["created"])
    fences: list[store.Fence] = field(default_factory=list)  # every fence ever handed out
    # Workflows:
    join_sets: dict[str, int] = field(default_factory=dict)  # join set -> children requested
    join_nexts: dict[str, int] = field(default_factory=dict)
    responses: list[tuple[str, str, datetime]] = field(default_factory=list)  # (join set, child, at)
    blocked_on: str | None = None
    # What the create asked for: a resubmission is the same call only with the same (D104).
    created_paused: bool = False
    created_scheduled_at: datetime | None = None
    created_due: datetime | None = None  # the scheduled time, or the creation instant

    @property
    def fence(self) -> store.Fence | None:
        return None if self.holder is None else store.Fence(self.holder[1], self.generation)

    def append(self, variant: str) -> None:
        self.version += 1
        self.events.append(variant)


def delete_everything() -> None:
    for model in (ExecutionBacktrace, LogEntry, Delay, JoinSetResponse, ExecutionEvent, ExecutionState):
        model.store_objects.all().delete()


class ModelledStore:
    """A state machine's model of the store: the executions as the specification says they
    must be, the clock, and the model's own transitions. ``StoreMachine`` (the test) adds
    the rules that call the real store and compare."""

    def __init__(self):
        super().__init__()
        delete_everything()
        self.now = T0
        self.execs: dict[str, Model] = {}
        self.counter = 0
        self.touched: set[str] = set()  # read back in full through store.get after the step
        self.forced: str | None = None

    def teardown(self):
        delete_everything()

    # -- ids and helpers -------------------------------------------------------------------

    def _next(self) -> int:
        self.counter += 1
        return self.counter

    def new_execution_id(self) -> str:
        return f"E_0{self._next():025d}"

    def new_run(self) -> tuple[str, str]:
        n = self._next()
        return f"Exr_0{n:025d}", f"Run_0{n:025d}"

    def pick(self, index: int, predicate) -> Model | None:
        if self.forced is not None:  # a scripted run (below) names its target
            chosen = self.execs[self.forced]
            assert predicate(chosen), f"the script's target {chosen.id} does not fit this step"
            self.touched.add(chosen.id)
            return chosen
        candidates = [e for e in self.execs.values() if predicate(e)]
        if not candidates:
            return None
        chosen = candidates[index % len(candidates)]
        self.touched.add(chosen.id)
        return chosen

    def any_exec(self, predicate) -> bool:
        return any(predicate(e) for e in self.execs.values())

    def unchanged(self, error_class, call):
        """``call`` must fail with ``error_class`` and write nothing (spec 000 §11)."""
        before = db_snapshot()
        with pytest.raises(error_class):
            call()
        assert db_snapshot() == before

    def request(self, kind: str, execution_id: str, params, **kwargs) -> store.CreateRequest:
        return store.CreateRequest(
            execution_id=execution_id,
            ffqn=FFQN_OF[kind],
            params=params,
            component_id=COMPONENT_OF[kind],
            deployment_id=DEPLOYMENT,
            **kwargs,
        )

    def new_model(self, kind: str, execution_id: str, params, *, paused=False, scheduled_at=None, parent=None):
        e = Model(
            id=execution_id,
            kind=kind,
            ffqn=FFQN_OF[kind],
            params=copy.deepcopy(params),
            parent=parent,
            state=PENDING,
            lifecycle=ACTIVE,
            at=scheduled_at or self.now,
            created_paused=paused,
            created_scheduled_at=scheduled_at,
            created_due=scheduled_at or self.now,
        )
        if paused:
            e.append("paused")
            e.lifecycle = PAUSED
        self.execs[execution_id] = e
        self.touched.add(execution_id)
        return e

    # -- model transitions (spec 000 §5.2, §6.4, §6.5; D8, D10) -------------------------

    def m_revoke(self, e: Model, fenced: bool) -> None:
        """D8: an event appended without the holder's fence that takes the row out of
        ``locked`` revokes the lock: generation + 1, holder cleared."""
        if not fenced and e.state == LOCKED:
            e.generation += 1
            e.holder = None

    def m_to_pending(self, e: Model, at: datetime, *, failures: int = 0) -> None:
        e.state, e.at = PENDING, at
        e.intermittent += failures
        e.retry = e.last_lock_version = e.blocked_on = None

    def m_finish(self, e: Model, result_kind: str, *, fenced: bool, retval: tuple | None = None) -> None:
        self.m_revoke(e, fenced)
        e.retval = retval or ("failure", json.loads(result_kind)["err"]["execution_failure"])
        e.append("finished")
        e.state, e.at, e.lifecycle, e.holder, e.result_kind = FINISHED, self.now, ACTIVE, None, result_kind
        e.retry = e.last_lock_version = e.blocked_on = None
        if e.parent is not None:  # D10: the child's Finished delivers its response
            self.m_deliver(e)

    def m_deliver(self, child: Model) -> None:
        """Spec 000 §6.4: store the response; unblock the parent only when it waits on that
        join set and is active or paused (never while cancelling). No version change."""
        parent = self.execs[child.parent[0]]
        self.touched.add(parent.id)
        join_set = child.parent[1]
        parent.responses.append((join_set, child.id, self.now))
        if parent.state == BLOCKED and parent.blocked_on == join_set and parent.lifecycle in (ACTIVE, PAUSED):
            self.m_to_pending(parent, max(parent.at, self.now))

    def m_lock(self, e: Model, holder: tuple[str, str], terms: store.LockTerms, *, new: bool) -> None:
        self.touched.add(e.id)
        e.append("locked")
        if new:
            e.generation += 1
            e.fences.append(store.Fence(holder[1], e.generation))
        e.holder = holder
        e.state, e.at = LOCKED, self.now + LOCK_DURATION
        e.retry = (terms.retry_config.max_retries, terms.retry_config.retry_exp_backoff)
        e.last_lock_version = e.version
        e.blocked_on = None

    def unfinished_children(self, e: Model) -> list[Model]:
        return [c for c in self.execs.values() if c.parent and c.parent[0] == e.id and c.state != FINISHED]

    def stale_fence(self, e: Model, index: int) -> store.Fence:
        stale = [f for f in e.fences if f != e.fence]
        if stale:
            return stale[index % len(stale)]
        return store.Fence(self.new_run()[1], e.generation)  # a run that never held it


def retval_of(retval) -> tuple:
    if isinstance(retval, Ok):
        return ("ok", exact(retval.value))
    if isinstance(retval, Err):
        return ("err", exact(retval.value))
    assert isinstance(retval, ExecutionFailure), retval
    return ("failure", retval.kind)


def observed_row(row: ExecutionState, variants: list[str]) -> dict:
    return {
        "state": row.state,
        "lifecycle": row.lifecycle,
        "version": row.corresponding_version,
        "next_version": row.next_version,
        "generation": row.lock_generation,
        "last_lock_version": row.last_lock_version,
        "holder": (row.executor_id, row.run_id) if row.run_id or row.executor_id else None,
        "at": row.pending_expires_finished,
        "intermittent": row.intermittent_event_count,
        "result_kind": row.result_kind,
        "blocked_on": row.join_set_id,
        "events": variants,
    }


def expected_row(e: Model) -> dict:
    return {
        "state": e.state,
        "lifecycle": e.lifecycle,
        "version": e.version,
        "next_version": e.version if e.state == FINISHED else e.version + 1,
        "generation": e.generation,
        "last_lock_version": e.last_lock_version,
        "holder": e.holder,
        "at": e.at,
        "intermittent": e.intermittent,
        "result_kind": e.result_kind,
        "blocked_on": e.blocked_on,
        "events": e.events,
    }
