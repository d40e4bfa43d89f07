"""Store values → the API's JSON bodies (``schemas``). One function per value, so the
list, the detail and the wait answer describe an execution the same way."""

from __future__ import annotations

from django.utils import timezone

from executions import catalog, store
from executions.events import event_to_json, retval_from_json, retval_to_json
from executions.outcome import outcome_of_retval


def summary(state: store.ExecutionSnapshot, now=None) -> dict:
    return {
        "execution_id": state.execution_id,
        "ffqn": state.ffqn,
        "status": state.status,
        "outcome": state.outcome(now or timezone.now()),
        "state": state.state,
        "lifecycle": state.lifecycle,
        "is_top_level": state.is_top_level,
        "created_at": state.created_at,
        "first_scheduled_at": state.first_scheduled_at,
        "updated_at": state.updated_at,
        "component_type": state.component_type,
        "component_digest": state.component_id_input_digest,
        "deployment_id": state.deployment_id,
    }


def detail(found: store.ExecutionDetail) -> dict:
    return {
        **summary(found.state),
        "version": found.state.corresponding_version,
        "finished": found.state.is_finished,
        "result": retval_to_json(found.retval) if found.retval is not None else None,
        "scheduled_at": found.scheduled_at,
        "finished_at": found.finished_at,
        "attempts": found.attempts,
        "parent_id": found.parent_id,
        "children": found.children,
        "params": found.params,
        "metadata": found.metadata,
        "retry_of": found.metadata.get("retry_of"),
        "waiting_for": store.waiting_for_code(found.state),
    }


def page(found: store.Page) -> dict:
    now = timezone.now()
    return {
        "items": [summary(state, now) for state in found.items],
        "next_cursor": found.older_cursor,
        "prev_cursor": found.newer_cursor,
    }


def event(record: store.EventRecord) -> dict:
    encoded = event_to_json(record.event)
    return {
        "version": record.version,
        "created_at": record.created_at,
        "variant": record.event.VARIANT,
        "data": None if isinstance(encoded, str) else encoded[record.event.VARIANT],
    }


def response(found: store.Response) -> dict:
    return {
        "seq": found.seq,
        "created_at": found.created_at,
        "join_set_id": found.join_set_id,
        "delay_id": found.delay_id,
        "delay_success": found.delay_success,
        "child_execution_id": found.child_execution_id,
        "finished_version": found.finished_version,
        "child_result": retval_to_json(found.child_retval) if found.child_retval is not None else None,
    }


def log(record: store.LogRecord) -> dict:
    return {
        "id": record.id,
        "run_id": record.run_id,
        "created_at": record.created_at,
        "level": record.level,
        "message": record.message,
        "stream": record.stream,
        "text": record.payload.decode("utf-8", "replace") if record.payload is not None else None,
    }


def waited(execution_id: str, result: dict | None) -> dict:
    """``result`` in Obelisk's shape, or None when the wait ended first."""
    outcome = outcome_of_retval(retval_from_json(result)) if result is not None else None
    return {"execution_id": execution_id, "finished": result is not None, "outcome": outcome, "result": result}


def audit(record: store.AuditRecord) -> dict:
    return {
        "created_at": record.created_at,
        "actor": record.actor,
        "via": record.via,
        "action": record.action,
        "execution_id": record.execution_id,
        "detail": record.detail,
    }


def deployment(info: catalog.DeploymentInfo) -> dict:
    return {
        "deployment_id": info.deployment_id,
        "created_at": info.created_at,
        "last_active_at": info.last_active_at,
        "status": info.status,
        "digest": info.digest,
        "description": info.description,
        "created_by": info.created_by,
        "manifest": info.manifest,
        "components": [{"name": n, "type": t, "digest": d} for n, t, d in info.components],
    }


def upgrade(moved: list[str], refused: list[tuple[str, str]], report: dict) -> dict:
    """What an upgrade did: the executions moved, those refused since the dry run, and the report."""
    return {
        "moved": moved,
        "refused": [{"execution_id": execution_id, "reason": reason} for execution_id, reason in refused],
        "report": report,
    }
