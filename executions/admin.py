"""The operator console for executions: find, filter, inspect, time-travel; cancel, pause,
resume, retry.

Everything is read-only here: every state change goes through ``executions.client`` (so
it is audited with the admin user as the actor, ``via="admin"``) and from there through
``executions.store``, never through model forms. Reading needs Django's view permission,
acting ``obelisk_executions.act_on_executions``; every action asks for confirmation on a
page of its own (a POST form, like Django's delete confirmation).

- The list (``ExecutionStateAdmin.changelist_view``): one narrow row per execution (id,
  function, outcome badge, reason, exact creation time, duration), filters by outcome,
  state, function, top level, deployment, component and creation date, and a search by id,
  function or the text of a result or failure (``store.find_by_result_text``).
  Bulk cancel, pause, resume and retry, each execution through the client.
- The execution page (``change_view``; its content is built by ``executions.console_page``,
  rendered by ``templates/admin/obelisk_executions/executionstate/change_form.html``):
  outcome, arguments, result or error with the traceback, timings, the action buttons that
  apply, the children with durations, then the history as a timeline (``?as_of=<version>``:
  the execution as of that event, ``executions.timetravel``), responses, logs, backtraces,
  the audit trail and the raw row. An unfinished execution's page re-reads itself (D92).
- The audit trail across executions: ``executions.admin_audit``.

Ids appear in the addresses as they are, not in the admin's escaping (D90).
"""

from __future__ import annotations

from collections import OrderedDict

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from executions import client, console_page, display, errors, store
from executions.admin_audit import AuditEntryAdmin  # noqa: F401  (registers the audit page)
from executions.admin_filters import (
    CappedPaginator,
    ComponentFilter,
    CreatedWithinFilter,
    DeploymentFilter,
    FinishedWithinFilter,
    FunctionFilter,
    OutcomeFilter,
    TopLevelFilter,
    without_jit,
)
from executions.console_page import execution_url
from executions.ids import ExecutionId
from executions.models import Delay, ExecutionState, LogEntry
from executions.state_machine import Lifecycle, State
from executions.store.listing import filter_text as check_search_text

ACT_PERMISSION = "obelisk_executions.act_on_executions"
MAX_SEARCH_IDS = 500
SEARCH_SCOPE = 20_000  # newest executions a search by part of a text reads (D95)


class RawIdChangeList(ChangeList):
    """Links to each row with its id as it is, not in the admin's ``_5F`` escaping, so the
    address can be copied (D90). Obelisk's ids need no escaping in a path."""

    def url_for_result(self, result):
        opts = self.opts
        return reverse(
            f"admin:{opts.app_label}_{opts.model_name}_change",
            args=(getattr(result, self.pk_attname),),
            current_app=self.model_admin.admin_site.name,
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    """The console's pages show what the store holds; only the store writes it."""

    def get_changelist(self, request, **kwargs):
        return RawIdChangeList

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


POLL_SECONDS = 2  # how often an unfinished execution's page re-reads itself (D92)


def execution_id_of(object_id: str) -> str:
    """The execution id in a console URL: written as it is (D90), or in the admin's
    ``_5F`` escaping of older links and bookmarks. A raw id never needs unescaping (an
    escaped one has ``_5F`` after its ``E``, which no ULID allows)."""
    if store_id_is_valid(object_id):
        return object_id
    return unquote(object_id)


def store_id_is_valid(text: str) -> bool:
    try:
        ExecutionId.parse(text)
    except errors.InvalidId:
        return False
    return True


def act_url(execution_id: str, action: str) -> str:
    return reverse("admin:obelisk_executions_executionstate_act", args=[execution_id, action])


def searched_scope(queryset):
    """``queryset`` from the creation time of its ``SEARCH_SCOPE``-th newest row on: what a
    search by part of a text reads (D95). One walk of ``t_state_created``."""
    newest = queryset.order_by("-created_at", "-execution_id").values_list("created_at", flat=True)
    bound = list(newest[SEARCH_SCOPE - 1 : SEARCH_SCOPE])
    return queryset.filter(created_at__gte=bound[0]) if bound else queryset


def short_id(execution_id: str) -> str:
    """``E_01JABC…WXYZ`` (and the child suffix): enough to tell rows apart."""
    top, dot, rest = execution_id.partition(".")
    if len(top) > 14:
        top = f"{top[:8]}…{top[-4:]}"
    return top + (f".{rest}" if dot else "")


class ExecutionChangeList(RawIdChangeList):
    """Reads each page's results in one store call and works out each row's outcome once."""

    def get_results(self, request):
        super().get_results(request)
        if (self.show_all and self.can_show_all) or not self.multi_page:
            # Django reads the whole queryset then (the capped count said it is short): a
            # LIMIT keeps that read bounded too (D94).
            self.result_list = self.result_list[: max(self.list_max_show_all, self.list_per_page)]
        self.result_list = list(self.result_list)
        finished = [row.execution_id for row in self.result_list if row.is_finished]
        retvals = store.get_finished_results(finished) if finished else {}
        now = timezone.now()
        for row in self.result_list:
            row.console_now = now
            row.console_retval = retvals.get(row.execution_id)
            row.console_outcome = store.ExecutionSnapshot.of(row).outcome(now)


# ---------------------------------------------------------------------------------------
# Actions: what applies, and doing it through the client
# ---------------------------------------------------------------------------------------

ACTIONS = OrderedDict(
    [
        ("cancel", ("Cancel", "Request cancellation of")),
        ("pause", ("Pause", "Pause")),
        ("resume", ("Resume", "Resume")),
        ("retry", ("Retry", "Retry")),
        ("run_now", ("Run now", "Run now (make due at once)")),
    ]
)


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


# ---------------------------------------------------------------------------------------
# The executions admin
# ---------------------------------------------------------------------------------------


@admin.register(ExecutionState)
class ExecutionStateAdmin(ReadOnlyAdmin):
    list_display = ("short_id", "ffqn", "outcome_badge", "reason", "created", "duration")
    list_display_links = ("short_id",)
    # Each filter is served by an index at any size, and no facet counts (D94;
    # executions/admin_filters.py).
    list_filter = (
        OutcomeFilter,
        FinishedWithinFilter,
        CreatedWithinFilter,
        TopLevelFilter,
        "state",
        "lifecycle",
        FunctionFilter,
        DeploymentFilter,
        ComponentFilter,
    )
    show_facets = admin.ShowFacets.NEVER
    paginator = CappedPaginator
    sortable_by = ("short_id", "created")  # orders an index serves
    search_fields = ("execution_id",)  # see get_search_results
    search_help_text = (
        "A whole execution id; or part of an id, a function name, or words of an error or a failure,"
        f" among the newest {SEARCH_SCOPE:,} executions the filters select."
    )
    ordering = ("-created_at", "-execution_id")
    actions = ["cancel_selected", "pause_selected", "resume_selected", "retry_selected"]
    list_per_page = 50
    show_full_result_count = False
    empty_value_display = ""
    change_form_template = "admin/obelisk_executions/executionstate/change_form.html"

    # -- permissions -------------------------------------------------------------------

    def has_act_permission(self, request) -> bool:
        return request.user.has_perm(ACT_PERMISSION)

    def get_changelist(self, request, **kwargs):
        return ExecutionChangeList

    def changelist_view(self, request, extra_context=None):
        # The app sidebar would push the outcome and reason columns off a 1366 px screen.
        context = {"is_nav_sidebar_enabled": False, **(extra_context or {})}
        if request.method != "GET":  # actions go through the client, in transactions of their own
            return super().changelist_view(request, context)
        with without_jit():  # (D95)
            response = super().changelist_view(request, context)
            if hasattr(response, "render"):
                response.render()  # its queries too
        return response

    # -- columns -----------------------------------------------------------------------

    @admin.display(description="execution", ordering="execution_id")
    def short_id(self, obj):
        return format_html(
            '<span title="{}" class="obelisk-id">{}</span>', obj.execution_id, short_id(obj.execution_id)
        )

    def _outcome(self, obj) -> str:
        outcome = getattr(obj, "console_outcome", None)
        return outcome or store.ExecutionSnapshot.of(obj).outcome(timezone.now())

    @admin.display(description="outcome", ordering="state")
    def outcome_badge(self, obj):
        return display.outcome_badge(self._outcome(obj))

    @admin.display(description="reason")
    def reason(self, obj):
        if obj.is_finished:
            retval = getattr(obj, "console_retval", None)
            if retval is None:
                retval = store.get_finished_result(obj.execution_id)
            text = display.short_reason(retval, 70)
            full = display.short_reason(retval, 1000)
            return format_html('<span title="{}">{}</span>', full, text) if text else ""
        if obj.intermittent_event_count:
            return f"{obj.intermittent_event_count} failed attempt(s), retrying"
        return ""

    @admin.display(description="created (UTC)", ordering="created_at")
    def created(self, obj):
        return format_html('<span class="obelisk-time">{}</span>', display.exact_time(obj.created_at))

    @admin.display(description="duration")
    def duration(self, obj):
        now = getattr(obj, "console_now", None) or timezone.now()
        if obj.is_finished:
            return display.format_duration(obj.pending_expires_finished - obj.created_at)
        if obj.state == State.PENDING_AT and obj.pending_expires_finished > now:
            return format_html(
                '<span class="obelisk-muted">due in {}</span>',
                display.format_duration(obj.pending_expires_finished - now),
            )
        return format_html(
            '<span class="obelisk-muted">{} so far</span>', display.format_duration(now - obj.created_at)
        )

    # -- search ------------------------------------------------------------------------

    def get_search_results(self, request, queryset, search_term):
        """A whole execution id: that execution, whatever the filters (a child's too). Else
        part of an id, of a function name, or words of an error or a failure, among the newest
        ``SEARCH_SCOPE`` executions the filters select: a range of ``t_state_created``,
        bounded at any table size (D95)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            check_search_text(term, "search text")
        except errors.StoreError:  # a NUL, a lone surrogate, or over 1,024 characters
            return queryset.none(), False
        exact = ExecutionState.objects.filter(pk=term)
        if exact.exists():
            return exact.order_by(*queryset.query.order_by), False
        scope = searched_scope(queryset)
        condition = Q(execution_id__icontains=term) | Q(ffqn__icontains=term)
        try:
            ids = store.find_by_result_text(term, limit=MAX_SEARCH_IDS, within=scope)
        except (errors.StoreError, ValueError):
            ids = []
        if ids:
            condition |= Q(pk__in=ids)
        return scope.filter(condition), False

    # -- bulk actions (confirmation page first) ----------------------------------------

    def _bulk(self, request, queryset, action: str):
        label, verb = ACTIONS[action]
        ids = list(queryset.values_list("execution_id", flat=True)[:500])
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

    # -- URLs --------------------------------------------------------------------------

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<path:object_id>/act/<str:action>/",
                self.admin_site.admin_view(self.act_view),
                name="{}_{}_act".format(*info),
            ),
        ] + super().get_urls()

    # -- the execution page ------------------------------------------------------------

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            context = console_page.build(request, execution_id_of(object_id))
        except (errors.NotFound, errors.InvalidId):
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        can_act = self.has_act_permission(request) and context["as_of"] is None
        state = context["state"]
        context.update(
            {
                **self.admin_site.each_context(request),
                "is_nav_sidebar_enabled": False,
                "opts": self.opts,
                "title": f"Execution {state.execution_id}",
                "subtitle": None,
                "has_view_permission": True,
                "actions": [
                    (name, ACTIONS[name][0], act_url(state.execution_id, name)) for name in applicable_actions(state)
                ]
                if can_act
                else [],
                "poll_seconds": POLL_SECONDS,
            }
        )
        context.update(extra_context or {})
        return TemplateResponse(request, self.change_form_template, context)

    def act_view(self, request, object_id, action):
        """Confirm (GET, or POST without ``post=yes``), then act (POST ``post=yes``)."""
        if action not in ACTIONS:
            raise Http404("unknown action")
        if not self.has_act_permission(request):
            raise PermissionDenied
        try:
            state = store.get_state(execution_id_of(object_id))
        except (errors.NotFound, errors.InvalidId):
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
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
            **self.admin_site.each_context(request),
            "opts": self.opts,
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


@admin.register(Delay)
class DelayAdmin(ReadOnlyAdmin):
    list_display = ("delay_id", "execution", "join_set_id", "expires", "is_paused")
    list_filter = ("is_paused",)
    search_fields = ("delay_id",)

    @admin.display(description="expires at (UTC)", ordering="expires_at")
    def expires(self, obj):
        return display.exact_time(obj.expires_at)


@admin.register(LogEntry)
class LogEntryAdmin(ReadOnlyAdmin):
    list_display = ("execution", "run_id", "at", "level", "message")
    list_filter = ("level",)
    search_fields = ("execution__execution_id", "message")

    @admin.display(description="at (UTC)", ordering="created_at")
    def at(self, obj):
        return display.exact_time(obj.created_at)
