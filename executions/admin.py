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
- The execution page (``change_view``, ``templates/admin/obelisk_executions/
  executionstate/change_form.html``): outcome, arguments, result or error with the
  traceback, timings, the action buttons that apply, then the history as a timeline
  (``?as_of=<version>``: the execution as of that event, ``executions.timetravel``),
  responses, the tree of children, logs, backtraces, the audit trail and the raw row.
"""

from __future__ import annotations

from collections import OrderedDict
from datetime import timedelta

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from deployments.models import DeploymentComponent
from executions import client, display, errors, store, timetravel
from executions.events import ExecutionFailure, Finished, Locked, TemporarilyFailed, TemporarilyTimedOut
from executions.models import Delay, ExecutionState, LogEntry
from executions.outcome import FAILURE_OUTCOMES, OUTCOMES
from executions.state_machine import Lifecycle, State

ACT_PERMISSION = "obelisk_executions.act_on_executions"
MAX_LOGS = 2000
MAX_SEARCH_IDS = 500


class ReadOnlyAdmin(admin.ModelAdmin):
    """The console's pages show what the store holds; only the store writes it."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def execution_url(execution_id: str, **query) -> str:
    url = reverse("admin:obelisk_executions_executionstate_change", args=[quote(execution_id)])
    if query:
        url += "?" + "&".join(f"{key}={value}" for key, value in query.items())
    return url


def short_id(execution_id: str) -> str:
    """``E_01JABC…WXYZ`` (and the child suffix): enough to tell rows apart."""
    top, dot, rest = execution_id.partition(".")
    if len(top) > 14:
        top = f"{top[:8]}…{top[-4:]}"
    return top + (f".{rest}" if dot else "")


# ---------------------------------------------------------------------------------------
# List filters
# ---------------------------------------------------------------------------------------


class OutcomeFilter(admin.SimpleListFilter):
    """``executions.outcome`` words, through the store's own filter (``failed`` is every
    failure kind)."""

    title = "outcome"
    parameter_name = "outcome"

    def lookups(self, request, model_admin):
        failed = ", ".join(o.replace("_", " ") for o in FAILURE_OUTCOMES)
        return [("failed", f"failed (any: {failed})")] + [(o, o.replace("_", " ")) for o in OUTCOMES]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        try:
            matching = store.filter_executions(store.ExecutionFilter(outcomes=(self.value(),), show_derived=True))
        except errors.StoreError:
            return queryset.none()
        return queryset.filter(pk__in=matching.values("pk"))


class DeploymentFilter(admin.SimpleListFilter):
    title = "deployment"
    parameter_name = "deployment"

    def lookups(self, request, model_admin):
        ids = ExecutionState.objects.order_by("deployment_id").values_list("deployment_id", flat=True).distinct()
        return [(d, d) for d in ids[:50]]

    def queryset(self, request, queryset):
        return queryset.filter(deployment_id=self.value()) if self.value() else queryset


class ComponentFilter(admin.SimpleListFilter):
    title = "component"
    parameter_name = "component"

    def lookups(self, request, model_admin):
        digests = (
            ExecutionState.objects.order_by("component_id_input_digest")
            .values_list("component_id_input_digest", flat=True)
            .distinct()[:50]
        )
        names = dict(
            DeploymentComponent.objects.filter(component_id__in=list(digests)).values_list(
                "component_id", "component_name"
            )
        )
        return [(d, f"{names.get(d, '?')} {d[:15]}…") for d in digests]

    def queryset(self, request, queryset):
        return queryset.filter(component_id_input_digest=self.value()) if self.value() else queryset


class TopLevelFilter(admin.SimpleListFilter):
    title = "level"
    parameter_name = "top_level"

    def lookups(self, request, model_admin):
        return [("yes", "top-level only"), ("no", "children only")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(is_top_level=True)
        if self.value() == "no":
            return queryset.filter(is_top_level=False)
        return queryset


class ExecutionChangeList(ChangeList):
    """Reads each page's results in one store call and works out each row's outcome once."""

    def get_results(self, request):
        super().get_results(request)
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
    list_filter = (
        OutcomeFilter,
        "state",
        "lifecycle",
        "ffqn",
        TopLevelFilter,
        DeploymentFilter,
        ComponentFilter,
    )
    search_fields = ("execution_id",)  # see get_search_results
    search_help_text = "An execution id (or part of one), a function name, or words of a result or error."
    date_hierarchy = "created_at"
    ordering = ("-created_at", "-execution_id")
    actions = ["cancel_selected", "pause_selected", "resume_selected"]
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
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

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
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(execution_id__icontains=term) | Q(ffqn__icontains=term)
        try:
            ids = store.find_by_result_text(term, limit=MAX_SEARCH_IDS)
        except (errors.StoreError, ValueError):
            ids = []
        if ids:
            condition |= Q(pk__in=ids)
        return queryset.filter(condition), False

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
        execution_id = unquote(object_id)
        try:
            context = self._page_context(request, execution_id)
        except (errors.NotFound, errors.InvalidId):
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        context.update(extra_context or {})
        return TemplateResponse(request, self.change_form_template, context)

    def _page_context(self, request, execution_id: str) -> dict:
        now = timezone.now()
        log = store.get(execution_id)
        detail = client.get(execution_id)
        state = log.state
        execution_id = state.execution_id

        # Time travel: ?as_of=<version>.
        as_of = None
        raw = request.GET.get("as_of")
        if raw not in (None, ""):
            try:
                as_of = timetravel.as_of(log.events, log.responses, int(raw))
            except ValueError:
                messages.warning(request, f"No event at version {raw[:20]}; showing the present.")
        if as_of is not None and as_of.is_last:
            as_of = None
        events = as_of.events if as_of else log.events
        responses = as_of.responses if as_of else log.responses
        outcome = as_of.status if as_of else state.outcome(now)

        # Timeline.
        timeline = []
        previous = None
        for record in events:
            event = record.event
            failure = None
            if isinstance(event, TemporarilyFailed) and event.detail:
                failure = event.detail
            elif isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
                failure = event.retval.detail
            timeline.append(
                {
                    "version": record.version,
                    "at": display.exact_time(record.created_at),
                    "since": display.format_duration(record.created_at - previous) if previous else "",
                    "title": display.EVENT_TITLES.get(event.VARIANT, event.VARIANT),
                    "variant": event.VARIANT,
                    "text": display.describe_event(event),
                    "detail": failure,
                    "url": execution_url(execution_id, as_of=record.version),
                    "current": as_of is not None and record.version == as_of.version,
                }
            )
            previous = record.created_at
        hidden_events = len(log.events) - len(events)

        # Result, error and traceback (the present only).
        retval = detail.retval if as_of is None else None
        if as_of is not None:
            finished_events = [r for r in events if isinstance(r.event, Finished)]
            retval = finished_events[-1].event.retval if finished_events else None
        traceback_text, traceback_source = None, None
        if isinstance(retval, ExecutionFailure) and retval.detail:
            traceback_text, traceback_source = retval.detail, "the final failure"
        else:
            for record in reversed(events):
                if isinstance(record.event, TemporarilyFailed) and record.event.detail:
                    traceback_text = record.event.detail
                    traceback_source = f"the last failed attempt (version {record.version}): {record.event.reason}"
                    break
                if isinstance(record.event, TemporarilyTimedOut):
                    break
        result_json = None
        if retval is not None and not isinstance(retval, ExecutionFailure):
            result_json = display.pretty_json(retval.value)

        # Timings.
        locks = [r.created_at for r in events if isinstance(r.event, Locked)]
        end = None
        if as_of is not None:
            end = as_of.at
        elif detail.finished_at is not None:
            end = detail.finished_at
        ended = retval is not None
        reference = end if end is not None else now
        first_lock = locks[0] if locks else None
        timings = [
            ("created", display.exact_time(state.created_at)),
            ("scheduled at", display.exact_time(detail.scheduled_at)),
            ("first run started", display.exact_time(first_lock)),
            ("finished", display.exact_time(detail.finished_at) if ended else "—"),
            (
                "queued",
                display.format_duration(max(first_lock - detail.scheduled_at, timedelta(0)))
                if first_lock
                else "not started",
            ),
            (
                "running",
                (display.format_duration(reference - first_lock) + ("" if ended else " so far")) if first_lock else "—",
            ),
            ("total", display.format_duration(reference - state.created_at) + ("" if ended else " so far")),
            ("attempts", str(len(locks))),
            (
                "failed attempts",
                str(sum(isinstance(r.event, (TemporarilyFailed, TemporarilyTimedOut)) for r in events)),
            ),
        ]

        # Tree of children; time travel shows what was requested by then.
        tree = []
        if as_of is None:
            for child, child_retval in store.get_tree(execution_id)[1:]:
                depth = child.execution_id.count(".") - execution_id.count(".")
                tree.append(
                    {
                        "id": child.execution_id,
                        "short": child.execution_id[len(execution_id) + 1 :],
                        "url": execution_url(child.execution_id),
                        "ffqn": child.ffqn,
                        "outcome": child.outcome(now),
                        "badge": display.outcome_badge(child.outcome(now)),
                        "reason": display.short_reason(child_retval, 80),
                        "indent": (depth - 1) * 1.5,
                    }
                )
        requests = []
        if as_of is not None:
            for request_ in as_of.requests:
                response = request_.response
                if request_.kind == "child":
                    if response is not None and response.child_retval is not None:
                        child_outcome = timetravel._retval_outcome(response.child_retval)
                        reason = display.short_reason(response.child_retval, 80)
                    else:
                        child_outcome, reason = "running", "no response yet"
                    url = execution_url(request_.id)
                else:
                    child_outcome = "ok" if response is not None else "scheduled"
                    reason = "fired" if response is not None else "waiting"
                    url = None
                requests.append(
                    {
                        "id": request_.id,
                        "kind": request_.kind,
                        "ffqn": request_.ffqn or "delay",
                        "join_set_id": request_.join_set_id,
                        "version": request_.requested_version,
                        "outcome": child_outcome,
                        "badge": display.outcome_badge(child_outcome),
                        "reason": reason,
                        "url": url,
                    }
                )

        # Links between executions.
        audit = client.audit_trail(execution_id)
        retried_as = [
            entry.detail["new_execution_id"]
            for entry in audit
            if entry.action == "retry" and entry.detail.get("new_execution_id")
        ]
        retry_of = detail.metadata.get("retry_of")

        # Logs by run, backtraces.
        logs = store.list_logs(execution_id, limit=MAX_LOGS)
        if as_of is not None:
            logs = [entry for entry in logs if entry.created_at <= as_of.at]
        runs: OrderedDict[str, list] = OrderedDict()
        for entry in logs:
            text = entry.message if entry.message is not None else (entry.payload or b"").decode("utf-8", "replace")
            runs.setdefault(entry.run_id, []).append(
                {"at": display.exact_time(entry.created_at), "what": entry.level or entry.stream, "text": text}
            )
        backtraces = [
            {
                "from": low,
                "to": high,
                "frames": "\n".join(f"{f['file']}:{f['line']} in {f['function']}: {f['code']}" for f in frames),
            }
            for low, high, frames in store.list_backtraces(execution_id)
            if as_of is None or low <= as_of.version
        ]

        can_act = self.has_act_permission(request) and as_of is None
        actions = (
            [
                (
                    name,
                    ACTIONS[name][0],
                    reverse("admin:obelisk_executions_executionstate_act", args=[quote(execution_id), name]),
                )
                for name in applicable_actions(state)
            ]
            if can_act
            else []
        )
        return {
            **self.admin_site.each_context(request),
            "is_nav_sidebar_enabled": False,
            "opts": self.opts,
            "title": f"Execution {execution_id}",
            "subtitle": None,
            "has_view_permission": True,
            "execution_id": execution_id,
            "state": state,
            "detail": detail,
            "outcome": outcome,
            "outcome_badge": display.outcome_badge(outcome),
            "reason": display.short_reason(retval, 300) if retval is not None else "",
            "arguments": display.pretty_json(detail.params),
            "metadata": detail.metadata,
            "result_json": result_json,
            "retval": retval,
            "traceback_text": traceback_text,
            "traceback_source": traceback_source,
            "timings": timings,
            "timeline": timeline,
            "hidden_events": hidden_events,
            "responses": [
                {
                    "seq": r.seq,
                    "at": display.exact_time(r.created_at),
                    "join_set_id": r.join_set_id,
                    "what": r.child_execution_id or r.delay_id,
                    "url": execution_url(r.child_execution_id) if r.child_execution_id else None,
                    "result": display.describe_retval(r.child_retval)
                    if r.child_retval is not None
                    else ("delay fired" if r.delay_success else "delay cancelled" if r.delay_id else ""),
                }
                for r in responses
            ],
            "tree": tree,
            "requests": requests,
            "as_of": as_of,
            "as_of_at": display.exact_time(as_of.at) if as_of else None,
            "present_url": execution_url(execution_id),
            "parent_url": execution_url(detail.parent_id) if detail.parent_id else None,
            "retry_of": retry_of,
            "retry_of_url": execution_url(retry_of) if retry_of else None,
            "retried_as": [(new_id, execution_url(new_id)) for new_id in retried_as],
            "runs": runs,
            "backtraces": backtraces,
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
            "internal": [(name, getattr(state, name)) for name in store.ExecutionSnapshot.__dataclass_fields__],
            "actions": actions,
            "deployment_url": reverse("admin:obelisk_deployments_deployment_change", args=[quote(state.deployment_id)]),
            "list_url": reverse("admin:obelisk_executions_executionstate_changelist"),
        }

    def act_view(self, request, object_id, action):
        """Confirm (GET, or POST without ``post=yes``), then act (POST ``post=yes``)."""
        if action not in ACTIONS:
            raise Http404("unknown action")
        if not self.has_act_permission(request):
            raise PermissionDenied
        execution_id = unquote(object_id)
        try:
            state = store.get_state(execution_id)
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
