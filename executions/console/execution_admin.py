"""The executions list and the execution page: find, filter, inspect, time-travel; cancel,
pause, resume, retry, run now.

- The list: one narrow row per execution (``columns``), filters by outcome, finished or
  created within a window, level, state, lifecycle, function, deployment and component
  (``filters``), a search by id, function or the words of an error (``search``), a capped
  count (``limits``), and bulk actions (``actions``).
- The page (``<execution>/``): its sections are built by ``executions.console.page`` and
  rendered by ``change_form.html``, with the buttons of the actions that apply; each action
  asks first on ``<execution>/act/<action>/`` (``actions.act_view``).

why: D90, D92, D94, D95
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import path

from executions import errors
from executions.console import page
from executions.console.actions import BulkActions, act_view, action_buttons
from executions.console.columns import ExecutionChangeList, ExecutionColumns
from executions.console.filters import (
    ComponentFilter,
    CreatedWithinFilter,
    DeploymentFilter,
    FinishedWithinFilter,
    FunctionFilter,
    OutcomeFilter,
    TopLevelFilter,
)
from executions.console.limits import CappedPaginator, without_jit
from executions.console.readonly import ReadOnlyAdminMixin
from executions.console.search import SEARCH_HELP, search_executions
from executions.console.urls import execution_id_of
from executions.models import ExecutionState

POLL_SECONDS = 2  # how often an unfinished execution's page re-reads itself (D92)


@admin.register(ExecutionState)
class ExecutionStateAdmin(ExecutionColumns, BulkActions, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("short_id", "ffqn", "outcome_badge", "reason", "created", "duration")
    list_display_links = ("short_id",)
    # Each filter is served by an index at any size, and no facet counts (D94).
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
    search_help_text = SEARCH_HELP
    ordering = ("-created_at", "-execution_id")
    actions = ["cancel_selected", "pause_selected", "resume_selected", "retry_selected"]
    list_per_page = 50
    show_full_result_count = False
    empty_value_display = ""
    change_form_template = "admin/obelisk_executions/executionstate/change_form.html"

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

    def get_search_results(self, request, queryset, search_term):
        """``executions.console.search``: bounded at any table size (D95); never
        duplicates."""
        return search_executions(queryset, search_term), False

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<path:object_id>/act/<str:action>/",
                self.admin_site.admin_view(self.act_view),
                name="{}_{}_act".format(*info),
            ),
        ] + super().get_urls()

    def change_view(self, request, object_id, form_url="", extra_context=None):
        if not self.has_view_permission(request):
            raise PermissionDenied
        try:
            context = page.build(request, execution_id_of(object_id))
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
                "actions": action_buttons(state) if can_act else [],
                "poll_seconds": POLL_SECONDS,
            }
        )
        context.update(extra_context or {})
        return TemplateResponse(request, self.change_form_template, context)

    def act_view(self, request, object_id, action):
        """Confirm (GET, or POST without ``post=yes``), then act (POST ``post=yes``)."""
        return act_view(self, request, object_id, action)
