"""The API's request and response bodies, as the OpenAPI document shows them.

Requests forbid unknown fields and take booleans and text strictly: a typo (``"pasued"``)
or ``"paused": "no"`` must be a 422, not silently something else. Results keep Obelisk's
shape (``{"ok": …}``, ``{"err": …}``, ``{"execution_failure": {"kind": …}}``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from ninja import Schema
from pydantic import AwareDatetime, ConfigDict, StrictBool, StrictStr, WithJsonSchema

from executions.ids import DEPLOYMENT_ID_PATTERN, EXECUTION_ID_PATTERN, TOP_LEVEL_ID_PATTERN

MAX_BIGINT = 2**63 - 1  # every version, seq and id column is a bigint


def _shown_pattern(pattern: str, description: str) -> WithJsonSchema:
    """An id's format, shown as a ``pattern`` in the document (D105). Only shown: the
    parsers check it (``executions.ids``), so a malformed id stays a 400 ``invalid_id``
    that says what is wrong, not a 422 quoting a regular expression."""
    return WithJsonSchema({"type": "string", "pattern": pattern, "description": description})


ExecutionIdText = Annotated[
    str, _shown_pattern(EXECUTION_ID_PATTERN, "`E_<ULID>`; a child's adds `.<kind>:<name>_<index>` segments")
]
TopLevelIdText = Annotated[StrictStr, _shown_pattern(TOP_LEVEL_ID_PATTERN, "`E_<ULID>`: a top-level execution id")]
DeploymentIdText = Annotated[str, _shown_pattern(DEPLOYMENT_ID_PATTERN, "`Dep_<ULID>`")]


class Strict(Schema):
    model_config = ConfigDict(extra="forbid")


class SubmitIn(Strict):
    function: StrictStr
    arguments: list[Any] | dict[str, Any]
    execution_id: TopLevelIdText | None = None
    scheduled_at: AwareDatetime | None = None
    paused: StrictBool = False


class StubIn(Strict):
    value: Any
    error: StrictBool = False


class ErrorOut(Schema):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None
    field: str | None = None  # the field an invalid schedule names (``invalid_schedule``)


class SubmittedOut(Schema):
    execution_id: ExecutionIdText
    created: bool
    retry_of: ExecutionIdText | None = None


class ExecutionSummary(Schema):
    execution_id: ExecutionIdText
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
    deployment_id: DeploymentIdText


class ExecutionOut(ExecutionSummary):
    version: int
    finished: bool
    result: dict[str, Any] | None
    scheduled_at: datetime
    finished_at: datetime | None
    attempts: int
    parent_id: ExecutionIdText | None
    children: list[ExecutionIdText]
    params: list[Any]
    metadata: dict[str, str]
    retry_of: ExecutionIdText | None
    # "waiting for component sha256:… (not served)": due, and no live cluster serves its code (D111)
    waiting_for: str | None


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
    execution_id: ExecutionIdText
    events: list[EventOut]
    max_version: int
    next_from_version: int | None


class ResponseOut(Schema):
    seq: int
    created_at: datetime
    join_set_id: str
    delay_id: str | None
    delay_success: bool | None
    child_execution_id: ExecutionIdText | None
    finished_version: int | None
    child_result: dict[str, Any] | None


class ResponsesPage(Schema):
    execution_id: ExecutionIdText
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
    execution_id: ExecutionIdText
    logs: list[LogOut]
    next_after_id: int | None


class WaitOut(Schema):
    execution_id: ExecutionIdText
    finished: bool
    outcome: str | None
    result: dict[str, Any] | None


class CancelOut(Schema):
    execution_id: ExecutionIdText
    outcome: str


class VersionOut(Schema):
    execution_id: ExecutionIdText
    next_version: int  # the version the execution's next event will carry


class StubOut(Schema):
    execution_id: ExecutionIdText
    written: bool


class AuditOut(Schema):
    created_at: datetime
    actor: str
    via: str
    action: str
    execution_id: ExecutionIdText
    detail: dict[str, Any]


class AuditPage(Schema):
    execution_id: ExecutionIdText
    entries: list[AuditOut]


class FunctionOut(Schema):
    ffqn: str
    component: str
    component_type: str
    component_digest: str
    deployment_id: DeploymentIdText
    parameters: list[dict[str, Any]]
    return_schema: dict[str, Any]


class ComponentOut(Schema):
    name: str
    type: str
    digest: str


class DeploymentOut(Schema):
    deployment_id: DeploymentIdText
    created_at: datetime
    last_active_at: datetime | None
    status: str
    digest: str
    description: str | None
    created_by: str | None
    manifest: str
    components: list[ComponentOut]


class DeploymentIn(Strict):
    manifest: StrictStr  # the text of an obelisk.toml


class VerdictOut(Schema):
    execution_id: ExecutionIdText
    ffqn: str
    component: str
    from_digest: str
    to_digest: str
    version: int  # the version an upgrade writes at
    clean: bool
    message: str | None  # what the engine would record (nondeterministic ones)
    note: str | None


class UpgradeReportOut(Schema):
    from_deployment: DeploymentIdText
    to_deployment: DeploymentIdText
    clean: int
    nondeterministic: int
    executions: list[VerdictOut]


class RefusedOut(Schema):
    execution_id: ExecutionIdText
    reason: str


class UpgradeOut(Schema):
    moved: list[ExecutionIdText]
    refused: list[RefusedOut]  # clean in the dry run, but changed or running since
    report: UpgradeReportOut


class HealthOut(Schema):
    status: str
    database: bool
    backlog: int
    clusters_alive: int
    clusters_known: int


# The error statuses each route really answers, for the OpenAPI document (D105): a client
# generated from it handles these and is told of no others. 500 is never documented.
SIGNED_IN = frozenset({401, 403, 503})  # no or bad credentials, no permission, database unreachable
POSTED = frozenset({400, 411, 413})  # a POST's framing: Content-Length, chunked (``parsing``), size
BY_ID = frozenset({400, 404})  # the id in the path is malformed (`invalid_id`) or unknown
VALIDATED = frozenset({422})  # query parameters or body fields django-ninja checks

LIST_ERRORS = SIGNED_IN | VALIDATED | {400}  # filters: a malformed parent id, a bad cursor
READ_ERRORS = SIGNED_IN | BY_ID
PAGE_ERRORS = READ_ERRORS | VALIDATED  # one execution's pages: history, responses, logs, audit
WAIT_ERRORS = PAGE_ERRORS | {429}  # past the caps on open waits (D101)
SUBMIT_ERRORS = SIGNED_IN | POSTED | VALIDATED | {404, 409}  # unknown function; idempotency conflict
CANCEL_ERRORS = SIGNED_IN | POSTED | BY_ID
ACTION_ERRORS = CANCEL_ERRORS | {409}  # in a state that does not allow it
STUB_ERRORS = ACTION_ERRORS | VALIDATED
FUNCTIONS_ERRORS = SIGNED_IN | {400, 404}  # a malformed or unknown deployment id
DEPLOYMENTS_ERRORS = SIGNED_IN | VALIDATED
CREATE_DEPLOYMENT_ERRORS = SIGNED_IN | POSTED | VALIDATED  # 400 also `invalid_manifest`
ACTIVATE_ERRORS = SIGNED_IN | POSTED | BY_ID
# 400 also `no_shared_component`; 409 `deployment_mismatch`: this server's code is not TO's
UPGRADE_ERRORS = SIGNED_IN | POSTED | BY_ID | VALIDATED | {409}
