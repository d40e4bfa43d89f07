"""The Python client: submit, inspect, wait for and act on executions, in-process.

Needs no worker code: a call is validated against the functions the workers stored with
their deployment (``executions.catalog``), so a web process, the CLI or a script that
imports none of the user's modules can submit. Every call goes through the store; every
action (submit, cancel, pause, resume, retry, stub) is recorded in the audit trail with the
actor, in the action's own transaction (``store.audited``). The REST API and the CLI are
thin layers over these functions::

    from executions import client
    execution_id = client.submit("py:demo/activities.greet", ["Ada"]).execution_id
    client.wait(execution_id, timeout=10)        # {"ok": "Hello, Ada!"}
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from executions import catalog, conf, errors, store, tracing
from executions.events import Err, Ok, RetVal, check_storable, retval_to_json
from executions.ids import ExecutionId, FunctionFqn

SYSTEM_ACTOR = "system"


@dataclass(frozen=True)
class Submitted:
    execution_id: str
    created: bool  # False: the same call with this id already existed (idempotent resubmit)


def _top_level_id(execution_id: str | None) -> str:
    if execution_id is None:
        return str(ExecutionId.generate())
    parsed = ExecutionId.parse(execution_id)
    if not parsed.is_top_level:
        raise errors.InvalidId(
            f"a submitted execution needs a top-level id `E_<ULID>`, got `{errors.excerpt(execution_id)}`"
        )
    return str(parsed)


def submit(
    ffqn: str,
    arguments: list | dict,
    *,
    execution_id: str | None = None,
    scheduled_at: datetime | None = None,
    paused: bool = False,
    metadata: dict[str, str] | None = None,
    deployment_id: str | None = None,
    actor: str = SYSTEM_ACTOR,
    via: str = "python",
) -> Submitted:
    """Create a top-level execution of ``ffqn`` with ``arguments`` (a JSON array, or an
    object by parameter name), checked against the function's stored schemas.

    Idempotent: the same ``execution_id`` with the same call returns it (``created`` is
    False); with another call it is ``Conflict``. Nothing is stored for a refused call.
    """
    if not isinstance(ffqn, str):
        raise errors.ValidationFailed(f"function must be text, got {type(ffqn).__name__}")
    FunctionFqn.parse(ffqn)
    execution_id = _top_level_id(execution_id)
    function = catalog.find_function(ffqn, deployment_id)
    # Before validation, which recurses: 50,000 nested arrays must be a clear error.
    check_storable(arguments, "arguments", max_depth=conf.get("MAX_JSON_DEPTH"))
    params = function.encode_arguments(arguments)
    request = store.CreateRequest(
        execution_id=execution_id,
        ffqn=ffqn,
        params=params,
        component_id=function.component_id,
        deployment_id=function.deployment_id,
        scheduled_at=scheduled_at,
        paused=paused,
        metadata=tracing.with_trace(metadata),  # the submitter's trace (executions.tracing)
    )
    if actor == SYSTEM_ACTOR and via == "python":
        outcome = store.create(request)  # the hot path: one round trip, nothing to audit
    else:
        with store.audited("submit", execution_id, actor=actor, via=via) as audit:
            outcome = store.create(request)
            audit.detail.update(ffqn=ffqn, created=not outcome.already_existed)
    return Submitted(execution_id, created=not outcome.already_existed)


def get(execution_id: str) -> store.ExecutionDetail:
    """One execution: its row, arguments, result, attempts, parent and children."""
    return store.get_detail(execution_id)


def result(execution_id: str) -> RetVal | None:
    """The result of a finished execution (``Ok``, ``Err`` or ``ExecutionFailure``), or
    None while it runs."""
    return store.get_finished_result(execution_id)


def wait(execution_id: str, *, timeout: float | None = None, release_connection: bool = True) -> dict:
    """Block until it finishes; its result in Obelisk's shape (``{"ok": …}``, ``{"err":
    …}`` or ``{"execution_failure": …}``). ``errors.Timeout`` after ``timeout`` seconds.
    Woken by LISTEN/NOTIFY on PostgreSQL. A wait longer than a tenth of a second gives
    this thread's database connection back while it blocks (outside a transaction), so
    that many waiting threads do not hold as many connections (D100);
    ``release_connection=False`` keeps it."""
    return retval_to_json(
        store.wait_for_finished_result(execution_id, timeout=timeout, release_connection=release_connection)
    )


def list_executions(filters: store.ExecutionFilter = store.ExecutionFilter(), **page) -> store.Page:
    """A page of executions, newest first (``store.list_executions``)."""
    return store.list_executions(filters, **page)


def cancel(execution_id: str, *, actor: str = SYSTEM_ACTOR, via: str = "python") -> store.CancelOutcome:
    """Request cancellation; the outcome says whether it was requested now or already
    cancelling / cancelled / finished (then nothing changes, and the audit says so)."""
    with store.audited("cancel", execution_id, actor=actor, via=via) as audit:
        outcome = store.cancel(execution_id)
        audit.detail["outcome"] = str(outcome)
    return outcome


def pause(execution_id: str, *, actor: str = SYSTEM_ACTOR, via: str = "python") -> int:
    with store.audited("pause", execution_id, actor=actor, via=via):
        return store.pause_execution(execution_id)


def resume(execution_id: str, *, actor: str = SYSTEM_ACTOR, via: str = "python") -> int:
    with store.audited("resume", execution_id, actor=actor, via=via):
        return store.unpause_execution(execution_id)


def run_now(execution_id: str, *, actor: str = SYSTEM_ACTOR, via: str = "python") -> int:
    """Make a scheduled (or backing-off) pending execution due now (``store.reschedule``)."""
    with store.audited("run_now", execution_id, actor=actor, via=via):
        return store.reschedule(execution_id)


def retry(execution_id: str, *, actor: str = SYSTEM_ACTOR, via: str = "python") -> Submitted:
    """Submit a finished top-level execution's function and arguments again, as a new
    execution linked to the old one (its ``retry_of`` metadata; the old one's audit entry
    names the new one). The new one runs the active deployment's code."""
    detail = store.get_detail(execution_id)
    if not detail.state.is_finished:
        raise errors.IllegalState(
            f"execution `{detail.state.execution_id}` is not finished; only a finished one can be retried"
        )
    if not detail.state.is_top_level:
        raise errors.IllegalState("only a top-level execution can be retried; retry its top-level execution")
    new_id = str(ExecutionId.generate())
    function = catalog.find_function(detail.state.ffqn)
    with store.audited("retry", detail.state.execution_id, actor=actor, via=via) as audit:
        store.create(
            store.CreateRequest(
                execution_id=new_id,
                ffqn=detail.state.ffqn,
                params=detail.params,
                component_id=function.component_id,
                deployment_id=function.deployment_id,
                metadata={"retry_of": detail.state.execution_id},
            )
        )
        audit.detail["new_execution_id"] = new_id
    return Submitted(new_id, created=True)


def stub(execution_id: str, value, *, error: bool = False, actor: str = SYSTEM_ACTOR, via: str = "python") -> bool:
    """Supply the result of a stubbed child execution (``ctx.stub``): ``{"ok": value}``, or
    ``{"err": value}`` with ``error``. Idempotent for the same value; another value is
    ``StubConflict``. Returns whether it wrote."""
    check_storable(value, "stub value", max_depth=conf.get("MAX_JSON_DEPTH"))
    retval = Err(value) if error else Ok(value)
    with store.audited("stub", execution_id, actor=actor, via=via) as audit:
        wrote = store.upsert_stub_response(execution_id, retval)
        audit.detail["wrote"] = wrote
    return wrote


def upgrade(
    execution_id: str,
    *,
    old_digest: str,
    new_digest: str,
    deployment_id: str,
    version: int,
    actor: str = SYSTEM_ACTOR,
    via: str = "python",
) -> int:
    """Move an execution to another component at the version its dry run replayed
    (``store.upgrade_execution_component``, D111), audited as ``upgrade``."""
    with store.audited("upgrade", execution_id, actor=actor, via=via):
        return store.upgrade_execution_component(
            execution_id, old_digest=old_digest, new_digest=new_digest, deployment_id=deployment_id, version=version
        )


def history(execution_id: str, *, from_version: int = 0, limit: int = 100) -> tuple[list[store.EventRecord], int]:
    """Its events from ``from_version`` on, and the highest version (``store.list_events``)."""
    return store.list_events(execution_id, from_version=from_version, limit=limit)


def responses(execution_id: str, *, after_seq: int = 0, limit: int = 100) -> tuple[list[store.Response], int]:
    """Its join-set responses after ``after_seq``, and the highest seq (``store.list_responses``)."""
    return store.list_responses(execution_id, after_seq=after_seq, limit=limit)


def logs(execution_id: str, *, after_id: int = 0, limit: int = 100) -> list[store.LogRecord]:
    """What its runs logged and printed, after log id ``after_id`` (``store.list_logs``)."""
    return store.list_logs(execution_id, after_id=after_id, limit=limit)


def audit_trail(execution_id: str, *, limit: int = 100) -> list[store.AuditRecord]:
    return store.list_audit(execution_id, limit=limit)


__all__ = [
    "Submitted",
    "audit_trail",
    "cancel",
    "get",
    "history",
    "list_executions",
    "logs",
    "pause",
    "result",
    "responses",
    "resume",
    "retry",
    "run_now",
    "stub",
    "submit",
    "wait",
]
