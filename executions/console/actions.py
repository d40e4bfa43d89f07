"""The console's actions on executions: cancel, pause, resume, retry and run now.

``applicable_actions`` says which apply to an execution as it stands; ``perform`` does one
through ``executions.client`` with the user as the actor and ``via="admin"``, so the store
writes it and its audit entry in one transaction. Each action asks first, on a page of its
own: ``act_view`` for one execution (``<execution>/act/<action>/``: GET confirms, POST
``post=yes`` acts; an action that no longer applies says so), ``BulkActions`` for the
list's selection. Acting needs ``obelisk_executions.act_on_executions``.

why: D51 (an action and its audit entry are one transaction), D54 (run now)
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone

from executions import client, display, errors, store
from executions.console.urls import act_url, execution_id_of, execution_url
from executions.state_machine import Lifecycle, State

ACT_PERMISSION = "obelisk_executions.act_on_executions"
MAX_BULK = 500  # executions one bulk action acts on
ACTIONS = {  # name: (button label, verb of the confirmation), in the buttons' order
    "cancel": ("Cancel", "Request cancellation of"),
    "pause": ("Pause", "Pause"),
    "resume": ("Resume", "Resume"),
    "retry": ("Retry", "Retry"),
    "run_now": ("Run now", "Run now (make due at once)"),
}


def applicable_actions(state: store.ExecutionSnapshot, now=None) -> list[str]:
    """The actions the console offers for an execution in this state."""
    now = now or timezone.now()
    if state.is_finished:
        return ["retry"] if state.is_top_level else []
    actions = []
    if state.lifecycle != Lifecycle.CANCELLING:
        actions.append("cancel")
    if state.lifecycle == Lifecycle.ACTIVE and not (state.state == State.LOCKED and state.component_type != "workflow"):
        actions.append("pause")
    if state.lifecycle == Lifecycle.PAUSED:
        actions.append("resume")
    if state.state == State.PENDING_AT and state.lifecycle == Lifecycle.ACTIVE and state.pending_expires_finished > now:
        actions.append("run_now")
    return actions


def action_buttons(state: store.ExecutionSnapshot) -> list[tuple[str, str, str]]:
    """``(name, label, confirmation URL)`` of each action that applies, for the page."""
    return [(name, ACTIONS[name][0], act_url(state.execution_id, name)) for name in applicable_actions(state)]


def perform(action: str, execution_id: str, actor: str) -> tuple[str, str | None]:
    """Do ``action`` through the client; ``(message, new execution id or None)``.
    Raises the store's error when the store refuses."""
    if action == "cancel":
        outcome = client.cancel(execution_id, actor=actor, via="admin")
        if outcome == store.CancelOutcome.REQUESTED:
            return "Cancellation requested.", None
        return f"Nothing to cancel: {str(outcome).replace('_', ' ')}.", None
    if action == "pause":
        client.pause(execution_id, actor=actor, via="admin")
        return "Paused.", None
    if action == "resume":
        client.resume(execution_id, actor=actor, via="admin")
        return "Resumed.", None
    if action == "run_now":
        client.run_now(execution_id, actor=actor, via="admin")
        return "Due now: the next free worker runs it.", None
    if action == "retry":
        submitted = client.retry(execution_id, actor=actor, via="admin")
        return f"Retried as {submitted.execution_id}.", submitted.execution_id
    raise Http404(f"unknown action {action}")


def act_view(model_admin, request, object_id: str, action: str):
    """Confirm (GET, or POST without ``post=yes``), then act (POST ``post=yes``)."""
    if action not in ACTIONS:
        raise Http404("unknown action")
    if not model_admin.has_act_permission(request):
        raise PermissionDenied
    try:
        state = store.get_state(execution_id_of(object_id))
    except (errors.NotFound, errors.InvalidId):
        return model_admin._get_obj_does_not_exist_redirect(request, model_admin.opts, object_id)
    page = execution_url(state.execution_id)
    label, verb = ACTIONS[action]
    if request.method == "POST" and request.POST.get("post") == "yes":
        try:
            text, new_id = perform(action, state.execution_id, request.user.get_username())
        except errors.StoreError as error:
            messages.error(request, f"{label} failed: {error}")
            return HttpResponseRedirect(page)
        messages.success(request, text)
        return HttpResponseRedirect(execution_url(new_id) if new_id else page)
    if action not in applicable_actions(state):
        messages.warning(
            request, f"{label} does not apply to this execution now (it is {state.outcome(timezone.now())})."
        )
        return HttpResponseRedirect(page)
    context = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "title": f"{label} execution {state.execution_id}?",
        "execution_id": state.execution_id,
        "ffqn": state.ffqn,
        "outcome_badge": display.outcome_badge(state.outcome(timezone.now())),
        "action": action,
        "action_label": label,
        "verb": verb,
        "page_url": page,
    }
    return TemplateResponse(request, "obelisk/confirm_action.html", context)


class BulkActions:
    """The list's bulk actions, as methods of the executions admin (``actions``): a
    confirmation page first, then each execution through ``perform``, a refusal named in a
    warning."""

    def has_act_permission(self, request) -> bool:
        return request.user.has_perm(ACT_PERMISSION)

    def _bulk(self, request, queryset, action: str):
        label, verb = ACTIONS[action]
        ids = list(queryset.values_list("execution_id", flat=True)[:MAX_BULK])
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": f"{label} {len(ids)} execution(s)?",
                "opts": self.opts,
                "action": f"{action}_selected",
                "action_label": label,
                "verb": verb,
                "execution_ids": ids,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                "select_across": request.POST.get("select_across", "0"),
            }
            return TemplateResponse(request, "obelisk/confirm_bulk_action.html", context)
        done = 0
        for execution_id in ids:
            try:
                perform(action, execution_id, request.user.get_username())
                done += 1
            except errors.StoreError as error:
                self.message_user(request, f"{execution_id}: {error}", messages.WARNING)
        self.message_user(request, f"{verb} {done} execution(s).")
        return None

    @admin.action(description="Cancel selected executions", permissions=["act"])
    def cancel_selected(self, request, queryset):
        return self._bulk(request, queryset, "cancel")

    @admin.action(description="Pause selected executions", permissions=["act"])
    def pause_selected(self, request, queryset):
        return self._bulk(request, queryset, "pause")

    @admin.action(description="Resume selected executions", permissions=["act"])
    def resume_selected(self, request, queryset):
        return self._bulk(request, queryset, "resume")

    @admin.action(description="Retry selected executions", permissions=["act"])
    def retry_selected(self, request, queryset):
        """Each through ``client.retry``, audited; unfinished or child executions are
        refused by the store and named in a warning."""
        return self._bulk(request, queryset, "retry")
