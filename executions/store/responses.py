"""Join-set responses and delays (spec 000 §6.4, §7.3, §7.4).

``deliver_response`` inserts a response under its parent's row lock and unblocks the parent
if it waits for that join set: a child's ``Finished`` (``transitions``), a delay that fires
(``timers``) or is cancelled. ``ResponseBatch`` inserts a group commit's responses in one
statement. The public operations deliver a delay's response and pause or resume a delay.

why: D10, D11, D55, D67"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection

from executions import errors, notify
from executions.events import compact_json
from executions.ids import (
    DelayId,
)
from executions.models import (
    Delay,
    ExecutionState,
    JoinSetResponse,
)
from executions.sql import Statements
from executions.state_machine import Lifecycle, State
from executions.store.common import (
    notify_pending,
    row_for_update,
    set_fields,
    to_pending,
    utc_now,
    write_transaction,
)
from executions.store.datatypes import DelayOutcome, Response


def append_delay_response(delay_id: str, success: bool, *, now: datetime | None = None) -> DelayOutcome:
    """Deliver a delay's response: fired (``success``) or cancelled; idempotent per delay."""
    now = utc_now(now)
    delay = DelayId.parse(delay_id)
    execution_id, join_set_id = str(delay.execution_id), str(delay.join_set_id)
    with write_transaction():
        row_for_update(execution_id)
        previous = list(
            JoinSetResponse.objects.filter(execution_id=execution_id, delay_id=str(delay)).values_list(
                "delay_success", flat=True
            )
        )
        if previous:
            return DelayOutcome.ALREADY_FIRED if previous[0] else DelayOutcome.ALREADY_CANCELLED
        if not Delay.objects.filter(delay_id=str(delay)).exists():
            raise errors.NotFound(f"delay `{delay}` was never requested")
        notes = notify.Notes()
        deliver_response(execution_id, join_set_id, now, notes, delay_id=str(delay), delay_success=success)
        notes.publish()
    return DelayOutcome.DELIVERED


def pause_delay(delay_id: str) -> None:
    _set_delay_paused(delay_id, True)


def unpause_delay(delay_id: str) -> None:
    _set_delay_paused(delay_id, False)


def _set_delay_paused(delay_id: str, paused: bool) -> None:
    delay = str(DelayId.parse(delay_id))
    with write_transaction():
        if not Delay.store_objects.filter(delay_id=delay).update(is_paused=paused):
            raise errors.NotFound(f"delay `{delay}` not found: already fired or cancelled")
        notes = notify.Notes(timers=True)
        notes.publish()


_INSERT_RESPONSE_SQL = """
INSERT INTO t_join_set_response
    (created_at, execution_id, join_set_id, delay_id, delay_success, child_execution_id, finished_version, seq)
VALUES (%s, %s, %s, %s, %s, %s, %s, (SELECT COALESCE(MAX(seq), 0) + 1 FROM t_join_set_response WHERE execution_id = %s))
RETURNING seq
"""


def deliver_response(
    parent_id: str,
    join_set_id: str,
    now: datetime,
    notes: notify.Notes,
    *,
    child_id: str | None = None,
    finished_version: int | None = None,
    delay_id: str | None = None,
    delay_success: bool | None = None,
    parents: dict[str, ExecutionState] | None = None,
    statements: Statements | None = None,
    responses: ResponseBatch | None = None,
) -> int | None:
    """Insert a response with the parent's next ``seq`` and unblock the parent if it waits
    for this join set (spec 000 §6.4). The parent's row is locked first (decision 11); the
    writes then go in one round trip, which returns the ``seq``. A group commit passes the
    parents it locked already, its own ``statements``, which carry the writes, and a
    ``ResponseBatch``, which inserts all its responses with one statement."""
    parent = (parents or {}).get(parent_id) or row_for_update(parent_id)
    batch = statements if statements is not None else Statements()
    if (
        parent.state == State.BLOCKED_BY_JOIN_SET
        and parent.join_set_id == join_set_id
        and parent.lifecycle != Lifecycle.CANCELLING
    ):
        fields = to_pending(parent, max(parent.pending_expires_finished, now)) | set_fields(parent, updated_at=now)
        batch.update(ExecutionState, [parent.pk], {name: getattr(parent, name) for name in sorted(fields)})
        notify_pending(parent, notes, announce_later=False)  # later: its awaiting run's lock expiry
    if delay_id is not None:
        batch.add("DELETE FROM t_delay WHERE delay_id = %s", [delay_id])
    notes.responses.append(parent_id)
    row = (parent_id, join_set_id, delay_id, delay_success, child_id, finished_version)
    if responses is not None:
        responses.rows.append(row)
        return None
    created_at = _response_created_at(now)
    batch.add(_INSERT_RESPONSE_SQL, [created_at, *row, parent_id])
    return batch.run()[0][0] if statements is None else None


def _response_created_at(now: datetime):
    """``t_join_set_response.created_at`` as the raw insert statements take it."""
    return JoinSetResponse._meta.get_field("created_at").get_db_prep_save(now, connection)


_INSERT_RESPONSES_SQL = """
INSERT INTO t_join_set_response
    (created_at, execution_id, join_set_id, delay_id, delay_success, child_execution_id, finished_version, seq)
SELECT %s::timestamptz, r.execution_id, r.join_set_id, r.delay_id, r.delay_success, r.child_execution_id,
    r.finished_version,
    (SELECT COALESCE(MAX(seq), 0) FROM t_join_set_response t WHERE t.execution_id = r.execution_id) + r.n
FROM json_to_recordset(%s) AS r(
    execution_id text, join_set_id text, delay_id text, delay_success boolean, child_execution_id text,
    finished_version bigint, n integer
)
RETURNING execution_id, child_execution_id, seq, created_at
"""


@dataclass
class ResponseBatch:
    """The responses of one group commit, inserted together once all are known.

    On PostgreSQL one statement: each parent's responses take the seqs after its highest,
    in the order they were added (the subquery sees the table as it was before the
    statement, and ``n`` numbers a parent's rows). SQLite runs in-process, so there each
    is its own statement, as for a single response. The parents' rows are locked, so no
    other response can take a seq in between (decision 11, D55)."""

    rows: list[tuple] = field(default_factory=list)

    def add_to(self, statements: Statements, now: datetime) -> None:
        if not self.rows:
            return
        created_at = _response_created_at(now)
        if connection.vendor != "postgresql":
            for row in self.rows:
                statements.add(_INSERT_RESPONSE_SQL, [created_at, *row, row[0]])
            return
        counts: Counter[str] = Counter()
        records = []
        for parent_id, join_set_id, delay_id, delay_success, child_id, finished_version in self.rows:
            counts[parent_id] += 1
            records.append(
                {
                    "execution_id": parent_id,
                    "join_set_id": join_set_id,
                    "delay_id": delay_id,
                    "delay_success": delay_success,
                    "child_execution_id": child_id,
                    "finished_version": finished_version,
                    "n": counts[parent_id],
                }
            )
        statements.add(_INSERT_RESPONSES_SQL, [created_at, compact_json(records)])

    def inserted(self, returned: list[tuple], finished: dict[str, Any]) -> list[tuple[str, Response]]:
        """The children's responses as their parents' waiting runs would read them
        (``reads.responses_after``): from the ``RETURNING`` rows of the PostgreSQL insert,
        when it ran last in its batch, and the children's ``Finished`` events (``finished``:
        their JSON by child id). Given to this process's listeners at commit (D67)."""
        rows = {row[4]: row for row in self.rows if row[4] is not None}
        out = []
        for parent_id, child_id, seq, created_at in returned:
            if child_id not in rows or child_id not in finished:
                continue
            _, join_set_id, delay_id, delay_success, _, finished_version = rows[child_id]
            as_stored = json.loads(compact_json(finished[child_id]))
            response = Response.of(
                seq, created_at, join_set_id, delay_id, delay_success, child_id, finished_version, as_stored
            )
            out.append((parent_id, response))
        return out
