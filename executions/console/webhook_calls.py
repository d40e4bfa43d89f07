"""The console's "Webhook calls" list: every call a webhook endpoint accepted
(``t_webhook_call``), newest first, with its status, the execution it started or answered,
its idempotency key and how long it took. Refused calls (bad signature, no token) are not
stored, so they are not here (D118); the server log has them.

Read-only like the rest of the console; whoever may view executions may view it. Registered
by ``executions.admin``. why: D117, D118.
"""

from __future__ import annotations

from django.contrib import admin
from django.utils.html import format_html

from executions import display
from executions.console.readonly import ReadOnlyAdminMixin
from executions.console.urls import execution_url
from executions.models import WebhookCall

VIEW_EXECUTIONS = "obelisk_executions.view_executionstate"


def status_badge(status: int):
    """An HTTP status as a badge: 2xx green, 4xx amber, 5xx red (safe markup)."""
    background = "#2e7d32" if status < 300 else "#ef6c00" if status < 500 else "#c62828"
    return format_html(
        '<span class="obelisk-badge obelisk-http-{}" style="background:{};color:#fff">{}</span>',
        status,
        background,
        status,
    )


class StatusClassFilter(admin.SimpleListFilter):
    """``?status_class=4xx``: calls by the class of their status."""

    title = "status"
    parameter_name = "status_class"
    CLASSES = {"2xx": (200, 300), "4xx": (400, 500), "5xx": (500, 600)}

    def lookups(self, request, model_admin):
        return [(key, key) for key in self.CLASSES]

    def queryset(self, request, queryset):
        bounds = self.CLASSES.get(self.value() or "")
        if bounds is None:
            return queryset
        return queryset.filter(status__gte=bounds[0], status__lt=bounds[1])


@admin.register(WebhookCall)
class WebhookCallAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("received", "call_id", "endpoint", "status_shown", "execution", "idempotency_key", "duration")
    list_display_links = None
    list_filter = (StatusClassFilter, "endpoint")
    search_fields = ("=call_id", "=execution_id", "=idempotency_key")
    search_help_text = "A call id (Whc_…), an execution id or an idempotency key, exactly."
    ordering = ("-received_at", "-call_id")
    list_per_page = 100
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    actions = None

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW_EXECUTIONS) or super().has_view_permission(request, obj)

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    @admin.display(description="received (UTC)", ordering="received_at")
    def received(self, obj):
        return format_html('<span class="obelisk-time">{}</span>', display.exact_time(obj.received_at))

    @admin.display(description="status", ordering="status")
    def status_shown(self, obj):
        return status_badge(obj.status)

    @admin.display(description="execution")
    def execution(self, obj):
        if not obj.execution_id:
            return "—"
        return format_html('<a href="{}" class="obelisk-id">{}</a>', execution_url(obj.execution_id), obj.execution_id)

    @admin.display(description="duration", ordering="duration_ms")
    def duration(self, obj):
        return display.format_duration(obj.duration_ms / 1000)
