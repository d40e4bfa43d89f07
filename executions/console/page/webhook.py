"""The execution page's line "started by webhook call Whc_… (POST /github, 202)": the calls
that started or answered an execution (``store.webhook_calls_of``), the first of which
started it; the others are retried deliveries of the same idempotency key (D117). Each
links to the "Webhook calls" list, filtered to that call.
"""

from __future__ import annotations

from django.urls import reverse

from executions import store

CALLS_SHOWN = 20


def webhook_calls(execution_id: str) -> dict:
    """``{"webhook_calls": [...], "started_by_webhook": <first or None>}`` for the page."""
    calls = [
        {
            "call_id": call.call_id,
            "endpoint": call.endpoint,
            "status": call.status,
            "received_at": call.received_at,
            "idempotency_key": call.idempotency_key,
            "url": reverse("admin:obelisk_executions_webhookcall_changelist") + f"?q={call.call_id}",
        }
        for call in store.webhook_calls_of(execution_id, limit=CALLS_SHOWN)
    ]
    return {"webhook_calls": calls, "started_by_webhook": calls[0] if calls else None}
