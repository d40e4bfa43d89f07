"""The audit trail across executions: "what did bob do today".

Every operator action (console, API, CLI, Python) is one ``AuditEntry`` row written by
``store.audited`` in the action's own transaction; this page lists those rows newest
first, filtered by actor, channel, action and a relative time window, searchable by
execution id or actor. Read-only like the rest of the console; whoever may view executions
may view their audit trail. Registered by ``executions.admin``.

why: D51, D91
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from executions import display
from executions.console.readonly import ReadOnlyAdminMixin
from executions.console.urls import execution_url
from executions.models import AuditEntry
from executions.store.audit import SCHEDULE_SUBJECT, VIA

VIEW_EXECUTIONS = "obelisk_executions.view_executionstate"
ACTORS_SHOWN = 50
RECENT_FOR_ACTORS = 5000  # the actors offered are those of the newest entries: a bounded read


class ActorFilter(admin.SimpleListFilter):
    """``?actor=bob``: any actor works in the URL; the choices are the recent ones."""

    title = "actor"
    parameter_name = "actor"

    def lookups(self, request, model_admin):
        recent = AuditEntry.objects.order_by("-created_at").values_list("actor", flat=True)[:RECENT_FOR_ACTORS]
        actors = sorted(set(recent))[:ACTORS_SHOWN]
        chosen = self.value()
        if chosen and chosen not in actors:
            actors.append(chosen)
        return [(actor, actor) for actor in actors]

    def queryset(self, request, queryset):
        return queryset.filter(actor=self.value()) if self.value() else queryset


WINDOWS = {
    "1h": ("last hour", lambda now: now - timedelta(hours=1)),
    "today": ("today (UTC)", lambda now: now.replace(hour=0, minute=0, second=0, microsecond=0)),
    "24h": ("last 24 hours", lambda now: now - timedelta(days=1)),
    "7d": ("last 7 days", lambda now: now - timedelta(days=7)),
}


class WhenFilter(admin.SimpleListFilter):
    """A window relative to now: the last hour, today, the last day or week."""

    title = "when"
    parameter_name = "when"

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in WINDOWS.items()]

    def queryset(self, request, queryset):
        window = WINDOWS.get(self.value() or "")
        if window is None:
            return queryset
        return queryset.filter(created_at__gte=window[1](timezone.now()))


class ViaFilter(admin.SimpleListFilter):
    title = "via"
    parameter_name = "via"

    def lookups(self, request, model_admin):
        return [(via, via) for via in VIA]

    def queryset(self, request, queryset):
        return queryset.filter(via=self.value()) if self.value() else queryset


class ActionFilter(admin.SimpleListFilter):
    title = "action"
    parameter_name = "action_done"  # ``action`` is the admin's own bulk-action field

    def lookups(self, request, model_admin):
        names = ("cancel", "pause", "resume", "retry", "run_now", "stub", "submit", "upgrade")
        names += tuple(
            f"schedule_{verb}" for verb in ("create", "update", "pause", "resume", "trigger", "backfill", "delete")
        )
        return [(name, name.replace("_", " ")) for name in names]

    def queryset(self, request, queryset):
        return queryset.filter(action=self.value()) if self.value() else queryset


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("at", "actor", "via", "action", "execution", "detail_text")
    list_display_links = None
    list_filter = (WhenFilter, ActorFilter, ViaFilter, ActionFilter)
    search_fields = ("=actor", "execution_id")
    search_help_text = "An actor (exactly) or an execution id (or part of one)."
    ordering = ("-created_at", "-id")
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # a count per choice would scan the table (issue 36, item 3)
    actions = None

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW_EXECUTIONS) or super().has_view_permission(request, obj)

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    @admin.display(description="at (UTC)", ordering="created_at")
    def at(self, obj):
        return format_html('<span class="obelisk-time">{}</span>', display.exact_time(obj.created_at))

    @admin.display(description="execution")
    def execution(self, obj):
        subject = obj.execution_id
        if subject.startswith(SCHEDULE_SUBJECT):  # an action on a schedule (D116)
            url = reverse("admin:obelisk_executions_schedule_change", args=[subject.removeprefix(SCHEDULE_SUBJECT)])
        else:
            url = execution_url(subject)
        return format_html('<a href="{}" class="obelisk-id">{}</a>', url, subject)

    @admin.display(description="detail")
    def detail_text(self, obj):
        return format_html("<code>{}</code>", display.short_json(obj.detail, 120)) if obj.detail else ""
