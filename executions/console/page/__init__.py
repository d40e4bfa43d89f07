"""The execution page's content, one module per section, assembled by ``build``.

The page (``templates/admin/obelisk_executions/executionstate/change_form.html``) shows,
top to bottom: the outcome, and whether a live cluster serves its code (``code``), the
result or failure with its traceback (``result``), the timings (``timings``), the children
with their durations (``children``) or, as of a version, what had been requested by then
(``time_travel``), the history as a timeline whose versions time-travel (``history``), the
responses (``responses``), the logs and backtraces with their stored source lines
(``logs``, ``code``), and retries both ways with the audit trail (``retries_and_audit``).
``executions.console.execution_admin`` adds the actions a user may take and renders it;
an unfinished execution's page re-reads itself.

why: D90 (ids as they are in links), D91 (events named by what they did), D92 (the poll), D111
"""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from executions import client, display, store
from executions.console.page.children import children
from executions.console.page.history import export_link, timeline
from executions.console.page.logs import logs_and_backtraces
from executions.console.page.responses import responses
from executions.console.page.result import result_json, retval_as_of, traceback_of
from executions.console.page.retries_and_audit import retries_and_audit
from executions.console.page.time_travel import as_of_asked, requested_by_then
from executions.console.page.timings import timings
from executions.console.page.webhook import webhook_calls
from executions.console.urls import execution_url


def build(request, execution_id: str) -> dict:
    """The page's context (without the admin's own context and the actions)."""
    now = timezone.now()
    log = store.get(execution_id)
    detail = client.get(execution_id)
    state = log.state
    execution_id = state.execution_id
    as_of = as_of_asked(request, log)
    events = as_of.events if as_of else log.events
    retval = retval_as_of(detail, as_of, events)
    outcome = as_of.status if as_of else state.outcome(now)
    traceback_text, traceback_source = traceback_of(retval, events)
    context = {
        "execution_id": execution_id,
        "state": state,
        "detail": detail,
        "outcome": outcome,
        "is_finished": as_of is None and state.is_finished,
        "outcome_badge": display.outcome_badge(outcome),
        "reason": display.short_reason(retval, 300) if retval is not None else "",
        "waiting_for": store.waiting_for_code(state) if as_of is None else None,
        "arguments": display.pretty_json(detail.params),
        "metadata": detail.metadata,
        "result_json": result_json(retval),
        "retval": retval,
        "traceback_text": traceback_text,
        "traceback_source": traceback_source,
        "timings": timings(state, detail, as_of, events, retval, now),
        "timeline": timeline(execution_id, events, as_of),
        "export": export_link(execution_id),
        "hidden_events": len(log.events) - len(events),
        "responses": responses(as_of.responses if as_of else log.responses),
        "tree": children(execution_id, now) if as_of is None else [],
        "requests": requested_by_then(as_of) if as_of is not None else [],
        "as_of": as_of,
        "as_of_at": display.exact_time(as_of.at) if as_of else None,
        "present_url": execution_url(execution_id),
        "parent_url": execution_url(detail.parent_id) if detail.parent_id else None,
        "internal": [(name, getattr(state, name)) for name in store.ExecutionSnapshot.__dataclass_fields__],
        "deployment_url": reverse("admin:obelisk_deployments_deployment_change", args=[state.deployment_id]),
        "list_url": reverse("admin:obelisk_executions_executionstate_changelist"),
    }
    context.update(retries_and_audit(execution_id, detail))
    context.update(webhook_calls(execution_id))
    context.update(logs_and_backtraces(execution_id, as_of, log.events))
    return context
