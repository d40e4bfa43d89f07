"""Searching the log by the text of results and failures: the console's search "by the
text of the error".

``find_by_result_text`` reads ``Finished`` and ``TemporarilyFailed`` events with a LIKE /
ILIKE, bounded by the candidates the caller gives it (a whole-log scan only without them).

why: D95"""

from __future__ import annotations

from django.db import connection
from django.db.models import Q

from executions.events import RESULT_KIND_OK, Finished, TemporarilyFailed
from executions.state_machine import State
from executions.store.listing import filter_text

MAX_FOUND = 1000


def _like_pattern(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def find_by_result_text(text: str, *, limit: int = 200, within=None) -> list[str]:
    """Ids of executions whose result or a failed attempt contains ``text`` (case-insensitive
    for ASCII), newest event first: the console's search "by the text of the error".

    Searches the JSON text of ``Finished`` events (an error value, a failure's reason and
    traceback, or an ok value) and of ``TemporarilyFailed`` events (a failed attempt of an
    execution that may still be retrying). Strings inside JSON are escaped (a newline is
    ``\\n``), so search for words, not for multi-line excerpts.

    ``within``: a queryset of ``t_state`` rows (a bounded one, such as the console's newest
    executions under its filters) whose failures to search: of those that finished with an
    error value or a failure, or had a failed attempt, the events are read by key, one
    execution at a time, so the cost follows the size of ``within``, not the log's (D95).
    Ok values are not searched then. Without ``within``, the whole log is read.
    """
    text = filter_text(text, "search text")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FOUND:
        raise ValueError(f"limit must be between 1 and {MAX_FOUND}")
    if not text.strip():
        return []
    if connection.vendor == "postgresql":
        condition = "e.json_value::text ILIKE %s"
    else:  # SQLite's LIKE ignores ASCII case
        condition = "e.json_value LIKE %s ESCAPE '\\'"
    pattern = _like_pattern(text)
    if within is None:
        sql = (
            f"SELECT e.execution_id FROM t_execution_log AS e WHERE e.variant IN (%s, %s) AND {condition}"
            " ORDER BY e.created_at DESC LIMIT %s"
        )
        params = [Finished.VARIANT, TemporarilyFailed.VARIANT, pattern, limit * 4]
    else:
        failed = within.filter(
            (Q(state=State.FINISHED) & ~Q(result_kind=RESULT_KIND_OK)) | Q(intermittent_event_count__gt=0)
        )
        candidates, candidate_params = (
            failed.order_by()
            .values("execution_id", "created_at", "state", "corresponding_version", "intermittent_event_count")
            .query.sql_with_params()
        )
        # Correlated EXISTS with an OFFSET are not turned into joins: each candidate's result
        # is read by its key (its version is the row's last), its failed attempts by its id,
        # never the whole log (a LIKE's selectivity is a guess the planner got wrong).
        sql = (
            f"SELECT s.execution_id FROM ({candidates}) AS s WHERE"
            " (s.state = %s AND EXISTS (SELECT 1 FROM t_execution_log AS e WHERE e.execution_id = s.execution_id"
            f"  AND e.version = s.corresponding_version AND {condition} LIMIT 1 OFFSET 0))"
            " OR (s.intermittent_event_count > 0 AND EXISTS (SELECT 1 FROM t_execution_log AS e"
            f"  WHERE e.execution_id = s.execution_id AND e.variant = %s AND {condition} LIMIT 1 OFFSET 0))"
            " ORDER BY s.created_at DESC LIMIT %s"
        )
        params = [*candidate_params, State.FINISHED.value, pattern, TemporarilyFailed.VARIANT, pattern, limit]
    found: dict[str, None] = {}
    with connection.cursor() as cursor:
        # Several failed attempts of one execution may match: read more rows than ids wanted.
        cursor.execute(sql, params)
        for (execution_id,) in cursor.fetchall():
            found.setdefault(execution_id, None)
    return list(found)[:limit]
