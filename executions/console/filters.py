"""The executions list's filters, each answered from an index at any size.

- outcome: ``store.listing.outcome_condition`` on ``t_state`` itself (a range of
  ``t_state_outcome`` for a finished outcome, the partial indexes for the others);
- created / finished within the last 15 minutes, hour, day or week: a range of
  ``t_state_created`` or ``t_state_finished_at`` ("finished in the last hour" is the
  dashboard's own condition, so a card's count and its link agree);
- level: top-level executions by default (children on request);
- function, deployment, component: the choices come from the deployments' tables (a few
  rows), never from a ``SELECT DISTINCT`` over ``t_state``.

why: D93, D94
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import Q
from django.utils import timezone

from executions import errors
from executions.models import Deployment, DeploymentComponent
from executions.outcome import FAILURE_OUTCOMES, OUTCOMES
from executions.store.listing import finished_since, outcome_condition

RECENT_DEPLOYMENTS = 20  # the function and component choices come from these
WINDOWS = {
    "15m": ("last 15 minutes", timedelta(minutes=15)),
    "1h": ("last hour", timedelta(hours=1)),
    "1d": ("last day", timedelta(days=1)),
    "7d": ("last week", timedelta(days=7)),
}


class OutcomeFilter(admin.SimpleListFilter):
    """``executions.outcome`` words, through the store's own condition (``failed`` is every
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
            return queryset.filter(outcome_condition((self.value(),), timezone.now()))
        except errors.StoreError:
            return queryset.none()


class _WithinFilter(admin.SimpleListFilter):
    """A relative time window: the last 15 minutes, hour, day or week before the request."""

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in WINDOWS.items()]

    def queryset(self, request, queryset):
        window = WINDOWS.get(self.value() or "")
        if window is None:
            return queryset  # no window, or one this filter does not offer
        return queryset.filter(self.condition(timezone.now() - window[1]))


class CreatedWithinFilter(_WithinFilter):
    title = "created"
    parameter_name = "created"

    def condition(self, since):
        return Q(created_at__gte=since)


class FinishedWithinFilter(_WithinFilter):
    title = "finished"
    parameter_name = "finished"

    def condition(self, since):
        return finished_since(since)


class TopLevelFilter(admin.SimpleListFilter):
    """Top-level executions unless asked otherwise: a workflow's children are found from it
    (its page's tree) or here with "with children"."""

    title = "level"
    parameter_name = "top_level"
    CHOICES = {"all": "with children", "children": "children only"}

    def lookups(self, request, model_admin):
        return list(self.CHOICES.items())

    def choices(self, changelist):
        yield {
            "selected": self.value() not in self.CHOICES,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "top-level only",
        }
        for value, label in self.CHOICES.items():
            yield {
                "selected": self.value() == value,
                "query_string": changelist.get_query_string({self.parameter_name: value}),
                "display": label,
            }

    def queryset(self, request, queryset):
        if self.value() == "all":
            return queryset
        if self.value() == "children":
            return queryset.filter(is_top_level=False)
        return queryset.filter(is_top_level=True)


def _recent_components():
    newest = Deployment.objects.order_by("-created_at").values_list("deployment_id", flat=True)[:RECENT_DEPLOYMENTS]
    return DeploymentComponent.objects.filter(deployment_id__in=list(newest)).select_related("component")


class FunctionFilter(admin.SimpleListFilter):
    """The functions the newest deployments export (any function can be asked for by URL)."""

    title = "function"
    parameter_name = "ffqn"

    def lookups(self, request, model_admin):
        names = {export["ffqn"] for row in _recent_components() for export in row.component.exports_json}
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        return queryset.filter(ffqn=self.value()) if self.value() else queryset


class DeploymentFilter(admin.SimpleListFilter):
    title = "deployment"
    parameter_name = "deployment"

    def lookups(self, request, model_admin):
        ids = Deployment.objects.order_by("-created_at").values_list("deployment_id", flat=True)[:50]
        return [(d, d) for d in ids]

    def queryset(self, request, queryset):
        return queryset.filter(deployment_id=self.value()) if self.value() else queryset


class ComponentFilter(admin.SimpleListFilter):
    title = "component"
    parameter_name = "component"

    def lookups(self, request, model_admin):
        names = {row.component_id: row.component_name for row in _recent_components()}
        return [(d, f"{name} {d[:15]}…") for d, name in sorted(names.items(), key=lambda item: item[1])]

    def queryset(self, request, queryset):
        return queryset.filter(component_id_input_digest=self.value()) if self.value() else queryset
