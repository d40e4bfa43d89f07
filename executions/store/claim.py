"""The terms of a new lock, as each way of taking one writes them (spec 000 §6.3, §6.5 C).

``new_lock`` builds the ``Locked`` event; ``lock_fields`` the ``t_state`` columns it sets;
``lock_document`` and ``lock_ctes`` the document and the two data-modifying CTEs with which
one statement locks many rows. Used by ``locking`` (``lock_pending``), ``append`` (a child's
result that locks its parked parent) and ``create`` (children created locked).

why: D65, D69, D82"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from executions.events import Locked, compact_json, event_to_json
from executions.models import ExecutionState
from executions.sql import assignments_from, recordset_values
from executions.state_machine import State
from executions.store.common import millis
from executions.store.datatypes import LockTerms


def new_lock(terms: LockTerms, executor_id: str, run_id: str, deployment_id: str, now: datetime) -> Locked:
    """The ``Locked`` event of a new lock under ``terms`` (its generation set by the caller)."""
    return Locked(
        component_id=terms.component_id,
        executor_id=executor_id,
        deployment_id=deployment_id,
        run_id=run_id,
        lock_expires_at=now + terms.lock_duration,
        retry_config=terms.retry_config,
    )


_GENERATION = '"lock_generation":-1'  # where each row's generation goes in its Locked event


def lock_document(terms: LockTerms, locked: Locked) -> tuple[tuple[str, ...], dict[str, Any]]:
    """A new lock as one statement writes it (D69, D82): the names of its columns
    (``lock_fields``), and a document of their values (adapted as ``json_to_recordset``
    reads them) with its ``Locked`` event's JSON, cut where the statement puts each row's
    generation (``event_head``, ``event_tail``)."""
    fields = lock_fields(terms, locked)
    names = tuple(sorted(fields))
    body = {Locked.VARIANT: {**event_to_json(locked)[Locked.VARIANT], "lock_generation": -1}}
    head, tail = compact_json(body).split(_GENERATION)
    return names, {**recordset_values(ExecutionState, names, fields), "event_head": head, "event_tail": tail}


def lock_ctes(names: tuple[str, ...], source: str, rows: str, terms: str, *, update: str, log: str) -> str:
    """The two data-modifying CTEs of locks taken by one statement (D69, D82): ``update``
    gives each of ``rows`` (its ``execution_id``, and its ``corresponding_version`` and
    ``lock_generation`` as found, the row locked) the columns ``names`` of ``terms`` (a
    ``lock_document``) and moves its versions and generation on; ``log`` inserts its
    ``Locked`` event, the generation put in. ``source``: the ``FROM`` joining the two."""
    return f"""{update} AS (
    UPDATE t_state s SET corresponding_version = {rows}.corresponding_version + 1,
        last_lock_version = {rows}.corresponding_version + 1, lock_generation = {rows}.lock_generation + 1,
        {assignments_from(ExecutionState, names, terms)}, updated_at = %s
    FROM {source}
    WHERE s.execution_id = {rows}.execution_id
),
{log} AS (
    INSERT INTO t_execution_log
        (execution_id, version, created_at, json_value, variant, join_set_id, history_event_type, consumes_response)
    SELECT {rows}.execution_id, {rows}.corresponding_version + 1, %s,
        ({terms}.event_head || '"lock_generation":' || ({rows}.lock_generation + 1) || {terms}.event_tail)::json,
        '{Locked.VARIANT}', NULL, NULL, false
    FROM {source}
)"""


def lock_fields(terms: LockTerms, locked: Locked) -> dict[str, Any]:
    """The columns a new lock sets, besides the versions, the generation and ``updated_at``:
    one definition for ``lock_pending`` and for executions created locked (D65)."""
    return {
        "state": State.LOCKED,
        "pending_expires_finished": locked.lock_expires_at,
        "executor_id": locked.executor_id,
        "run_id": locked.run_id,
        "max_retries": terms.retry_config.max_retries,
        "retry_exp_backoff_millis": millis(terms.retry_config.retry_exp_backoff),
        "deployment_id": locked.deployment_id,
        "component_id_input_digest": terms.component_id.component_digest,
        "join_set_id": None,
        "join_set_closing": None,
        "result_kind": None,
    }
