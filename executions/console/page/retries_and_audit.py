"""The execution page's retries and audit trail: the execution it retries, the executions
that retried it, and every operator action on it.

Both come from what the client reads: ``retry_of`` in the execution's metadata, and the
``retry`` entries of its audit trail (``client.audit_trail``), each of which names the new
execution. The trail is the rows ``store.audited`` wrote in each action's transaction.

why: D51 (an action and its audit entry are one transaction), D91 (the audit trail)
"""

from __future__ import annotations

from executions import client, display
from executions.console.urls import execution_url


def retries_and_audit(execution_id: str, detail) -> dict:
    """Retries both ways, and the audit trail they are read from."""
    audit = client.audit_trail(execution_id)
    retried_as = [
        entry.detail["new_execution_id"]
        for entry in audit
        if entry.action == "retry" and entry.detail.get("new_execution_id")
    ]
    retry_of = detail.metadata.get("retry_of")
    return {
        "retry_of": retry_of,
        "retry_of_url": execution_url(retry_of) if retry_of else None,
        "retried_as": [(new_id, execution_url(new_id)) for new_id in retried_as],
        "audit": [
            {
                "at": display.exact_time(entry.created_at),
                "actor": entry.actor,
                "via": entry.via,
                "action": entry.action,
                "detail": display.short_json(entry.detail, 200),
            }
            for entry in audit
        ],
    }
