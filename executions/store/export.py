"""An execution's whole history as one JSON document, and that document read back.

``export_execution`` is what the API (``GET /api/v1/executions/{id}/export``), the
console's download and ``obelisk_status ID --export`` hand out: the execution, every event
of its log, every response it received, and a summary of each execution of its tree. It is
read in one snapshot (``reads.get`` and ``reads.get_tree``). ``read_export`` checks a
document and gives back what a replay needs (``workers.testing.replay``): a truncated,
edited or foreign document is an ``InvalidExport`` naming what is wrong, never a replay
of half a history. The format has a name and a version; a reader refuses versions it does
not know. why: D123
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from executions import errors
from executions.events import Created, event_from_json, event_to_json, retval_from_json, retval_to_json
from executions.store.datatypes import EventRecord, ExecutionSnapshot, Response
from executions.store.reads import get, get_tree

FORMAT = "obelisk-execution-history"
FORMAT_VERSION = 1


class InvalidExport(errors.ValidationFailed):
    """Not an execution history this version can read."""

    code = "invalid_export"


@dataclass(frozen=True)
class ExportedHistory:
    """A history read back from its document: what a replay takes."""

    execution_id: str
    ffqn: str
    events: list[EventRecord]
    responses: list[Response]
    next_version: int


def export_execution(execution_id: str) -> dict:
    """The document of ``execution_id`` (``NotFound`` when there is none)."""
    log = get(execution_id)
    tree = get_tree(log.state.execution_id)
    root_retval = tree[0][1]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "execution": {
            **_summary(log.state, root_retval),
            "version": log.state.corresponding_version,  # its last event's
            "next_version": log.state.next_version,
            "params": log.events[0].event.params if log.events else None,
        },
        "events": [
            {"version": r.version, "created_at": r.created_at.isoformat(), "event": event_to_json(r.event)}
            for r in log.events
        ],
        "responses": [_response(r) for r in log.responses],
        "children": [_summary(row, retval) for row, retval in tree[1:]],
    }


def export_filename(execution_id: str) -> str:
    """The name a download of the document is saved under."""
    return f"{execution_id.replace(':', '_')}.history.json"


def read_export(document: Any) -> ExportedHistory:
    """Check ``document`` (a parsed dict, or its JSON text) and read it back."""
    if isinstance(document, bytes | str):
        document = _parse_json(document)
    if not isinstance(document, dict):
        raise InvalidExport(f"an execution history is a JSON object, not {type(document).__name__}")
    if document.get("format") != FORMAT:
        raise InvalidExport(f'not an execution history: "format" is {document.get("format")!r}, not "{FORMAT}"')
    if document.get("format_version") != FORMAT_VERSION:
        raise InvalidExport(
            f"execution history format_version {document.get('format_version')!r} is not one this version reads "
            f"({FORMAT_VERSION})"
        )
    execution = _field(document, "execution", dict)
    execution_id, ffqn = _field(execution, "execution_id", str), _field(execution, "ffqn", str)
    events = [_event(i, item) for i, item in enumerate(_field(document, "events", list))]
    _check_log(events, execution_id)
    responses = [_read_response(i, item) for i, item in enumerate(_field(document, "responses", list))]
    version, next_version = _field(execution, "version", int), _field(execution, "next_version", int)
    if events[-1].version != version:
        raise InvalidExport(
            f"the history of {execution_id} is truncated: its last event is version {events[-1].version}, "
            f"the execution is at version {version}"
        )
    return ExportedHistory(execution_id, ffqn, events, responses, next_version)


def _summary(row: ExecutionSnapshot, retval) -> dict:
    return {
        "execution_id": row.execution_id,
        "ffqn": row.ffqn,
        "component_type": row.component_type,
        "component_digest": row.component_id_input_digest,
        "deployment_id": row.deployment_id,
        "state": row.state,
        "created_at": row.created_at.isoformat(),
        "result": retval_to_json(retval) if retval is not None else None,
    }


def _response(r: Response) -> dict:
    return {
        "seq": r.seq,
        "created_at": r.created_at.isoformat(),
        "join_set_id": r.join_set_id,
        "delay_id": r.delay_id,
        "delay_success": r.delay_success,
        "child_execution_id": r.child_execution_id,
        "finished_version": r.finished_version,
        "child_retval": retval_to_json(r.child_retval) if r.child_retval is not None else None,
    }


def _parse_json(text: bytes | str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as error:
        where = f" (line {error.lineno}, column {error.colno})" if isinstance(error, json.JSONDecodeError) else ""
        raise InvalidExport(f"the execution history is not valid JSON{where}: truncated or corrupted?") from None


def _field(container: dict, name: str, kind: type) -> Any:
    value = container.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise InvalidExport(f'the execution history\'s "{name}" is missing or not {kind.__name__}')
    return value


def _event(index: int, item: Any) -> EventRecord:
    try:
        return EventRecord(int(item["version"]), _time(item["created_at"]), event_from_json(item["event"]))
    except (KeyError, TypeError, ValueError, errors.ValidationFailed) as error:
        raise InvalidExport(f"event {index} of the execution history is corrupted: {error}") from None


def _check_log(events: list[EventRecord], execution_id: str) -> None:
    if not events or not isinstance(events[0].event, Created):
        raise InvalidExport(f"the history of {execution_id} does not start with Created: truncated?")
    for expected, record in enumerate(events):
        if record.version != expected:
            raise InvalidExport(
                f"the history of {execution_id} skips from version {expected - 1} to {record.version}: truncated?"
            )


def _read_response(index: int, item: Any) -> Response:
    try:
        retval = item["child_retval"]
        return Response(
            seq=int(item["seq"]),
            created_at=_time(item["created_at"]),
            join_set_id=str(item["join_set_id"]),
            delay_id=item["delay_id"],
            delay_success=item["delay_success"],
            child_execution_id=item["child_execution_id"],
            finished_version=item["finished_version"],
            child_retval=retval_from_json(retval) if retval is not None else None,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise InvalidExport(f"response {index} of the execution history is corrupted: {error}") from None


def _time(value: Any) -> datetime:
    at = datetime.fromisoformat(value)
    if at.tzinfo is None:
        raise ValueError(f"time {value!r} has no time zone")
    return at
