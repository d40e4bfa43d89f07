"""The execution page's join-set responses: each child result or delay outcome the
execution received, in ``seq`` order, with when it arrived and what it was.

As of a version, only the responses that had arrived by that event's time are shown
(``executions.timetravel`` picks them).

why: D90 (links with ids as they are)
"""

from __future__ import annotations

from executions import display
from executions.console.urls import execution_url


def responses(received) -> list[dict]:
    """One row per response."""
    rows = []
    for r in received:
        if r.child_retval is not None:
            result = display.describe_retval(r.child_retval)
        else:
            result = "delay fired" if r.delay_success else "delay cancelled" if r.delay_id else ""
        rows.append(
            {
                "seq": r.seq,
                "at": display.exact_time(r.created_at),
                "join_set_id": r.join_set_id,
                "what": r.child_execution_id or r.delay_id,
                "url": execution_url(r.child_execution_id) if r.child_execution_id else None,
                "result": result,
            }
        )
    return rows
