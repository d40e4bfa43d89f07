"""The API's request and response bodies, as the OpenAPI document shows them.

Requests forbid unknown fields and take booleans and text strictly: a typo (``"pasued"``)
or ``"paused": "no"`` must be a 422, not silently something else. Results keep Obelisk's
shape (``{"ok": …}``, ``{"err": …}``, ``{"execution_failure": {"kind": …}}``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ninja import Schema
from ninja.responses import codes_4xx
from pydantic import AwareDatetime, ConfigDict, StrictBool, StrictStr

MAX_BIGINT = 2**63 - 1  # every version, seq and id column is a bigint


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class SubmitIn(Strict):
    function: StrictStr
    arguments: list[Any] | dict[str, Any]
    execution_id: StrictStr | None = None
    scheduled_at: AwareDatetime | None = None
    paused: StrictBool = False


class StubIn(Strict):
    value: Any
    error: StrictBool = False


class ErrorOut(Schema):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class SubmittedOut(Schema):
    execution_id: str
    created: bool
    retry_of: str | None = None


class ExecutionSummary(Schema):
    execution_id: str
    ffqn: str
    status: str
    outcome: str
    state: str
    lifecycle: str
    is_top_level: bool
    created_at: datetime
    first_scheduled_at: datetime
    updated_at: datetime
    component_type: str
    component_digest: str
    deployment_id: str


class ExecutionOut(ExecutionSummary):
    version: int
    finished: bool
    result: dict[str, Any] | None
    scheduled_at: datetime
    finished_at: datetime | None
    attempts: int
    parent_id: str | None
    children: list[str]
    params: list[Any]
    metadata: dict[str, str]
    retry_of: str | None


class ExecutionPage(Schema):
    items: list[ExecutionSummary]
    next_cursor: str | None  # pass as older_than for the next (older) page
    prev_cursor: str | None  # pass as newer_than for the previous (newer) page


class EventOut(Schema):
    version: int
    created_at: datetime
    variant: str
    data: dict[str, Any] | None  # None for the unit variants (paused, unpaused, cancellation_requested)


class HistoryPage(Schema):
    execution_id: str
    events: list[EventOut]
    max_version: int
    next_from_version: int | None


class ResponseOut(Schema):
    seq: int
    created_at: datetime
    join_set_id: str
    delay_id: str | None
    delay_success: bool | None
    child_execution_id: str | None
    finished_version: int | None
    child_result: dict[str, Any] | None


class ResponsesPage(Schema):
    execution_id: str
    responses: list[ResponseOut]
    max_seq: int
    next_after_seq: int | None


class LogOut(Schema):
    id: int
    run_id: str
    created_at: datetime
    level: str | None
    message: str | None
    stream: str | None
    text: str | None  # a std-stream chunk as UTF-8, undecodable bytes replaced


class LogsPage(Schema):
    execution_id: str
    logs: list[LogOut]
    next_after_id: int | None


class WaitOut(Schema):
    execution_id: str
    finished: bool
    outcome: str | None
    result: dict[str, Any] | None


class CancelOut(Schema):
    execution_id: str
    outcome: str


class VersionOut(Schema):
    execution_id: str
    next_version: int  # the version the execution's next event will carry


class StubOut(Schema):
    execution_id: str
    written: bool


class AuditOut(Schema):
    created_at: datetime
    actor: str
    via: str
    action: str
    execution_id: str
    detail: dict[str, Any]


class AuditPage(Schema):
    execution_id: str
    entries: list[AuditOut]


class FunctionOut(Schema):
    ffqn: str
    component: str
    component_type: str
    component_digest: str
    deployment_id: str
    parameters: list[dict[str, Any]]
    return_schema: dict[str, Any]


class ComponentOut(Schema):
    name: str
    type: str
    digest: str


class DeploymentOut(Schema):
    deployment_id: str
    created_at: datetime
    last_active_at: datetime | None
    status: str
    digest: str
    description: str | None
    created_by: str | None
    manifest: str
    components: list[ComponentOut]


class HealthOut(Schema):
    status: str
    database: bool
    backlog: int
    clusters_alive: int
    clusters_known: int


# Every 4xx the API answers, for the OpenAPI document: django-ninja's ``codes_4xx`` leaves
# out 413 (a body over ``MAX_PAYLOAD_BYTES``) and 422 (validation), which routes answer too.
ERROR_STATUSES = frozenset(codes_4xx) | {413, 422}
