"""Reading executions: one, a filtered page, its history, responses, logs, audit trail,
and waiting for its result. Every route needs the view permission (the API's default)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Query, Router

from executions import client, errors, store
from executions.ids import ExecutionId
from executions.store import export as store_export
from obelisk_api import parsing, rendering, waiting
from obelisk_api.schemas import (
    LIST_ERRORS,
    MAX_BIGINT,
    PAGE_ERRORS,
    READ_ERRORS,
    WAIT_ERRORS,
    AuditPage,
    ErrorOut,
    ExecutionIdText,
    ExecutionOut,
    ExecutionPage,
    HistoryPage,
    LogsPage,
    ResponsesPage,
    WaitOut,
)

router = Router(tags=["executions"])
MAX_WAIT_SECONDS = 60.0
SINGLE_VALUED_FILTERS = (
    "function",
    "top_level_only",
    "parent",
    "created_after",
    "created_before",
    "older_than",
    "newer_than",
    "limit",
)


@router.get("/executions", response={200: ExecutionPage, LIST_ERRORS: ErrorOut})
def list_executions(
    request,
    function: str | None = Query(None, description="function name prefix, e.g. `py:demo/`"),
    status: list[str] = Query([], description=f"repeatable, ORed: {', '.join(store.STATUS_FILTERS)}"),
    outcome: list[str] = Query([], description="repeatable, ORed: ok, error, failed, timed_out, pending, running…"),
    top_level_only: bool = True,
    parent: ExecutionIdText | None = Query(None, description="only the direct children of this execution"),
    created_after: datetime | None = Query(None, description="inclusive, timezone-aware"),
    created_before: datetime | None = Query(None, description="exclusive, timezone-aware"),
    older_than: str | None = Query(None, description="`next_cursor` of the previous page"),
    newer_than: str | None = Query(None, description="`prev_cursor` of the previous page"),
    limit: int = Query(50, ge=1, le=1000),
):
    """Executions newest first, in pages whose cursors are keys `(created_at, id)`: an
    execution created while a client pages neither shifts nor repeats the older pages."""
    parsing.refuse_repeated(request, *SINGLE_VALUED_FILTERS)
    if not parent and "parent" in request.GET:  # `?parent=` names no execution: not "any parent"
        raise errors.InvalidId("parent: an empty text is not an execution id")
    filters = store.ExecutionFilter(
        ffqn_prefix=function,
        show_derived=not top_level_only,
        statuses=tuple(status),
        outcomes=tuple(outcome),
        created_after=created_after,
        created_before=created_before,
        parent_id=parent,
    )
    found = client.list_executions(filters, limit=limit, older_than=older_than, newer_than=newer_than)
    return rendering.page(found)


@router.get("/executions/{execution_id}", response={200: ExecutionOut, READ_ERRORS: ErrorOut})
def get_execution(request, execution_id: ExecutionIdText):
    """State, outcome, result, arguments, timestamps, attempts and tree links."""
    return rendering.detail(client.get(execution_id))


@router.get(
    "/executions/{execution_id}/export",
    response={200: dict[str, Any], READ_ERRORS: ErrorOut},
    url_name="execution_export",  # the console's download button links here
)
def export(request, execution_id: ExecutionIdText):
    """The execution's whole history as one JSON document (format
    `obelisk-execution-history`, with a `format_version`): the execution, every event,
    every response, and a summary of each execution of its tree. Keep it as a test
    fixture and replay it against new code: `workers.testing.replay(fn, document)` (D123)."""
    return store_export.export_execution(execution_id)


@router.get("/executions/{execution_id}/history", response={200: HistoryPage, PAGE_ERRORS: ErrorOut})
def history(
    request,
    execution_id: ExecutionIdText,
    from_version: int = Query(0, ge=0, le=MAX_BIGINT),
    limit: int = Query(100, ge=1, le=1000),
):
    """Its event log from `from_version` on; `next_from_version` continues it."""
    events, max_version = client.history(execution_id, from_version=from_version, limit=limit)
    last = events[-1].version if events else None
    return {
        "execution_id": execution_id,
        "events": [rendering.event(record) for record in events],
        "max_version": max_version,
        "next_from_version": last + 1 if last is not None and last < max_version else None,
    }


@router.get("/executions/{execution_id}/responses", response={200: ResponsesPage, PAGE_ERRORS: ErrorOut})
def responses(
    request,
    execution_id: ExecutionIdText,
    after_seq: int = Query(0, ge=0, le=MAX_BIGINT),
    limit: int = Query(100, ge=1, le=1000),
):
    """The join-set responses it received (children's results, fired delays), by `seq`."""
    store.get_state(execution_id)  # 404 for an unknown execution, not an empty list
    found, max_seq = client.responses(execution_id, after_seq=after_seq, limit=limit)
    last = found[-1].seq if found else None
    return {
        "execution_id": execution_id,
        "responses": [rendering.response(r) for r in found],
        "max_seq": max_seq,
        "next_after_seq": last if last is not None and last < max_seq else None,
    }


@router.get("/executions/{execution_id}/logs", response={200: LogsPage, PAGE_ERRORS: ErrorOut})
def logs(
    request,
    execution_id: ExecutionIdText,
    after_id: int = Query(0, ge=0, le=MAX_BIGINT),
    limit: int = Query(100, ge=1, le=1000),
):
    """What its runs logged and printed; `next_after_id` continues while the page was full."""
    store.get_state(execution_id)
    found = client.logs(execution_id, after_id=after_id, limit=limit)
    return {
        "execution_id": execution_id,
        "logs": [rendering.log(record) for record in found],
        "next_after_id": found[-1].id if len(found) == limit else None,
    }


@router.get("/executions/{execution_id}/wait", response={200: WaitOut, WAIT_ERRORS: ErrorOut})
def wait(request, execution_id: ExecutionIdText, timeout: float = Query(30.0, ge=0, le=MAX_WAIT_SECONDS)):
    """Block until it finishes or `timeout` seconds (at most 60) pass; the server waits at
    most its `OBELISK['MAX_WAIT']` (25 s by default, below the WSGI server's request
    timeout, D102). Always 200 for an existing execution: `finished` says which happened,
    so a client loops on one shape. The wait holds no database connection while it blocks
    (D100). Past the server's caps on open waits (per process, per user): 429
    `too_many_waits` with `Retry-After` (D101)."""
    try:
        with waiting.admitted(request.auth):
            result = client.wait(execution_id, timeout=waiting.capped(timeout))
    except waiting.TooManyWaits as refused:
        return refused.response()
    except errors.Timeout:
        result = None
    return rendering.waited(str(ExecutionId.parse(execution_id)), result)  # the wait found it: no read


@router.get("/executions/{execution_id}/audit", response={200: AuditPage, PAGE_ERRORS: ErrorOut})
def audit(request, execution_id: ExecutionIdText, limit: int = Query(100, ge=1, le=1000)):
    """Who acted on it (submit, cancel, pause, resume, retry, stub), newest first."""
    entries = client.audit_trail(execution_id, limit=limit)
    if not entries:
        store.get_state(execution_id)
    return {"execution_id": execution_id, "entries": [rendering.audit(e) for e in entries]}
