"""Acting on executions: submit, cancel, pause, resume, run now, retry, stub. Each needs the act
permission and is recorded in the audit trail with the caller's username, ``via="api"``."""

from __future__ import annotations

from ninja import Status

from executions import client, tracing
from obelisk_api.auth import ACT, actor
from obelisk_api.routes.executions import router
from obelisk_api.schemas import (
    ACTION_ERRORS,
    CANCEL_ERRORS,
    STUB_ERRORS,
    SUBMIT_ERRORS,
    CancelOut,
    ErrorOut,
    ExecutionIdText,
    StubIn,
    StubOut,
    SubmitIn,
    SubmittedOut,
    VersionOut,
)

VIA = "api"
# On the executions router (GET and POST /executions must share one URL pattern), each
# with ``auth=ACT`` instead of the API's default.
ACTING = {"auth": ACT, "tags": ["actions"]}


@router.post("/executions", response={200: SubmittedOut, 201: SubmittedOut, SUBMIT_ERRORS: ErrorOut}, **ACTING)
def submit(request, body: SubmitIn):
    """Start an execution: 201 when created. With `execution_id`, idempotent: the same
    call again is 200 (`created: false`); another call under that id is 409."""
    submitted = client.submit(
        body.function,
        body.arguments,
        execution_id=body.execution_id,
        scheduled_at=body.scheduled_at,
        paused=body.paused,
        metadata=tracing.trace_of_headers(request.headers),  # the caller's W3C trace, if any
        actor=actor(request),
        via=VIA,
    )
    return Status(
        201 if submitted.created else 200, {"execution_id": submitted.execution_id, "created": submitted.created}
    )


@router.post("/executions/{execution_id}/cancel", response={200: CancelOut, CANCEL_ERRORS: ErrorOut}, **ACTING)
def cancel(request, execution_id: ExecutionIdText):
    """Request cancellation; `outcome` says whether it was requested now or already
    cancelling, cancelled or finished (then nothing changed)."""
    outcome = client.cancel(execution_id, actor=actor(request), via=VIA)
    return {"execution_id": execution_id, "outcome": str(outcome)}


@router.post("/executions/{execution_id}/pause", response={200: VersionOut, ACTION_ERRORS: ErrorOut}, **ACTING)
def pause(request, execution_id: ExecutionIdText):
    """Stop it from being claimed (a running one finishes its current run)."""
    return {"execution_id": execution_id, "next_version": client.pause(execution_id, actor=actor(request), via=VIA)}


@router.post("/executions/{execution_id}/resume", response={200: VersionOut, ACTION_ERRORS: ErrorOut}, **ACTING)
def resume(request, execution_id: ExecutionIdText):
    return {"execution_id": execution_id, "next_version": client.resume(execution_id, actor=actor(request), via=VIA)}


@router.post("/executions/{execution_id}/retry", response={201: SubmittedOut, ACTION_ERRORS: ErrorOut}, **ACTING)
def retry(request, execution_id: ExecutionIdText):
    """Run a finished top-level execution's call again as a new execution (201), linked
    to this one by its `retry_of` metadata."""
    submitted = client.retry(execution_id, actor=actor(request), via=VIA)
    return Status(201, {"execution_id": submitted.execution_id, "created": True, "retry_of": execution_id})


@router.post("/executions/{execution_id}/run-now", response={200: VersionOut, ACTION_ERRORS: ErrorOut}, **ACTING)
def run_now(request, execution_id: ExecutionIdText):
    """Make a scheduled (or backing-off) pending execution due now; 409 otherwise."""
    return {"execution_id": execution_id, "next_version": client.run_now(execution_id, actor=actor(request), via=VIA)}


@router.post("/executions/{execution_id}/stub", response={200: StubOut, STUB_ERRORS: ErrorOut}, **ACTING)
def stub(request, execution_id: ExecutionIdText, body: StubIn):
    """Supply the result of a stubbed child (`ctx.stub`): `{"ok": value}`, or `{"err":
    value}` with `error`. The same value again is accepted (`written: false`)."""
    written = client.stub(execution_id, body.value, error=body.error, actor=actor(request), via=VIA)
    return {"execution_id": execution_id, "written": written}
