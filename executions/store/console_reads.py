"""Reads for the operator console that the other read modules do not cover."""

from __future__ import annotations

from django.db import connection

from executions.events import Finished, TemporarilyFailed
from executions.models import ExecutionEvent
from executions.store.common import _eid
from executions.store.listing import _filter_text
from executions.store.reads import get_event

MAX_FOUND = 1000


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def find_by_result_text(text: str, *, limit: int = 200) -> list[str]:
    """Ids of executions whose result or a failed attempt contains ``text`` (case-insensitive
    for ASCII), newest event first: the console's search "by the text of the error".

    Searches the JSON text of ``Finished`` events (an error value, a failure's reason and
    traceback, or an ok value) and of ``TemporarilyFailed`` events (a failed attempt of an
    execution that may still be retrying). Strings inside JSON are escaped (a newline is
    ``\\n``), so search for words, not for multi-line excerpts.
    """
    text = _filter_text(text, "search text")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FOUND:
        raise ValueError(f"limit must be between 1 and {MAX_FOUND}")
    if not text.strip():
        return []
    if connection.vendor == "postgresql":
        condition = "json_value::text ILIKE %s"
    else:  # SQLite's LIKE ignores ASCII case
        condition = "json_value LIKE %s ESCAPE '\\'"
    sql = (
        "SELECT execution_id FROM t_execution_log"
        f" WHERE variant IN (%s, %s) AND {condition}"
        " ORDER BY created_at DESC LIMIT %s"
    )
    found: dict[str, None] = {}
    with connection.cursor() as cursor:
        # Several failed attempts of one execution may match: read more rows than ids wanted.
        cursor.execute(sql, [Finished.VARIANT, TemporarilyFailed.VARIANT, _like_pattern(text), limit * 4])
        for (execution_id,) in cursor.fetchall():
            found.setdefault(execution_id, None)
    return list(found)[:limit]


def last_failure_detail(execution_id: str) -> tuple[int, str | None, str | None] | None:
    """``(version, reason, detail)`` of the execution's last failed attempt
    (``TemporarilyFailed``), or None: where a retried execution's traceback is."""
    version = (
        ExecutionEvent.objects.filter(execution_id=_eid(execution_id), variant=TemporarilyFailed.VARIANT)
        .order_by("-version")
        .values_list("version", flat=True)
        .first()
    )
    if version is None:
        return None
    event = get_event(execution_id, version).event
    return version, event.reason, event.detail
