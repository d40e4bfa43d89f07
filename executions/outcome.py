"""What an operator asks first: how did it end, or where is it now? (pure, no Django)

One word per execution, from its state, lifecycle and result kind: the console's badge, the
API's ``outcome`` field and its ``outcome`` filter all use it.

- finished: ``ok``, ``error`` (the function returned an error value), or the execution
  failure's kind: ``timed_out``, ``cancelled``, ``nondeterminism_detected``,
  ``out_of_fuel``, ``uncategorized``;
- not finished: ``cancelling`` or ``paused`` (the lifecycle wins), else ``running``
  (locked), ``blocked`` (a workflow waiting on a join set), ``scheduled`` (pending, due
  later) or ``pending`` (due now).
"""

from __future__ import annotations

import json
from datetime import datetime

from executions.events import RESULT_KIND_ERROR, RESULT_KIND_OK, Err, ExecutionFailure, FailureKind, Ok
from executions.state_machine import Lifecycle, State

FAILURE_OUTCOMES: tuple[str, ...] = FailureKind.__args__
FINISHED_OUTCOMES: tuple[str, ...] = ("ok", "error", *FAILURE_OUTCOMES)
UNFINISHED_OUTCOMES: tuple[str, ...] = ("pending", "scheduled", "running", "blocked", "paused", "cancelling")
OUTCOMES: tuple[str, ...] = FINISHED_OUTCOMES + UNFINISHED_OUTCOMES
# ``failed`` is a group: every execution failure (timed out, cancelled, uncategorized…).
OUTCOME_GROUPS: dict[str, tuple[str, ...]] = {"failed": FAILURE_OUTCOMES}


def outcome_of_result_kind(result_kind: str) -> str:
    """``t_state.result_kind`` (spec 000 §3.4) → ``ok``, ``error`` or the failure kind."""
    if result_kind == RESULT_KIND_OK:
        return "ok"
    if result_kind == RESULT_KIND_ERROR:
        return "error"
    return json.loads(result_kind)["err"]["execution_failure"]


def outcome_of_retval(retval) -> str:
    """A return value (``Ok``, ``Err``, ``ExecutionFailure``) → ``ok``, ``error`` or the failure kind."""
    if isinstance(retval, Ok):
        return "ok"
    if isinstance(retval, Err):
        return "error"
    if isinstance(retval, ExecutionFailure):
        return retval.kind
    raise TypeError(f"not a return value: {type(retval).__name__}")


def result_kind_of_outcome(outcome: str) -> str:
    """The inverse, for filtering by a finished outcome."""
    if outcome == "ok":
        return RESULT_KIND_OK
    if outcome == "error":
        return RESULT_KIND_ERROR
    return json.dumps({"err": {"execution_failure": outcome}}, separators=(",", ":"))


def outcome_of(
    state: str, lifecycle: str, result_kind: str | None, pending_expires_finished: datetime, now: datetime
) -> str:
    if state == State.FINISHED:
        return outcome_of_result_kind(result_kind)
    if lifecycle != Lifecycle.ACTIVE:
        return str(lifecycle)
    if state == State.LOCKED:
        return "running"
    if state == State.BLOCKED_BY_JOIN_SET:
        return "blocked"
    return "scheduled" if pending_expires_finished > now else "pending"


def expand_outcomes(names) -> tuple[str, ...]:
    """Outcome filter values → outcomes (``failed`` is every failure kind). ``ValueError``
    names the unknown ones."""
    expanded: list[str] = []
    unknown = []
    for name in names:
        if name in OUTCOME_GROUPS:
            expanded.extend(OUTCOME_GROUPS[name])
        elif name in OUTCOMES:
            expanded.append(name)
        else:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unknown outcome(s) {sorted(map(str, unknown))}; use {', '.join(OUTCOMES + ('failed',))}")
    return tuple(dict.fromkeys(expanded))


def waiting_for_code(state, served: frozenset[str] | set[str]) -> str | None:
    """``waiting for component sha256:… (not served)`` when ``state`` (a ``t_state`` row) is
    due and no live cluster serves its component digest (``store.served_digests``), else
    None: it is neither run by other code nor failed, it waits for its own (D111). While no
    cluster is alive at all (``served`` empty) nothing is said: every due execution waits
    then, and the dashboard's clusters table says so."""
    if state.state != State.PENDING_AT or state.lifecycle != Lifecycle.ACTIVE or not served:
        return None
    if state.component_id_input_digest in served:
        return None
    return f"waiting for component {state.component_id_input_digest} (not served)"
