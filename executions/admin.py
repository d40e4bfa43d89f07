"""The operator console for executions: find, filter, inspect; cancel, pause, resume.

Everything is read-only here: state changes go through ``executions.store`` (the admin
actions call it), never through model forms.
"""

from django.contrib import admin, messages
from django.utils.html import format_html

from executions import display, errors, store
from executions.events import event_from_json, retval_from_json
from executions.models import Delay, ExecutionBacktrace, ExecutionEvent, ExecutionState, JoinSetResponse, LogEntry


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class EventInline(ReadOnlyInline):
    model = ExecutionEvent
    fields = ("version", "created_at", "variant", "description")
    readonly_fields = fields
    ordering = ("version",)
    verbose_name_plural = "event history"

    @admin.display(description="event")
    def description(self, obj):
        return display.describe_event(event_from_json(obj.json_value))


class ResponseInline(ReadOnlyInline):
    model = JoinSetResponse
    fk_name = "execution"
    fields = ("seq", "created_at", "join_set_id", "child_execution", "delay_id", "delay_success")
    readonly_fields = fields
    ordering = ("seq",)


class LogInline(ReadOnlyInline):
    """What the execution's runs logged and printed (``t_log``)."""

    model = LogEntry
    fields = ("created_at", "run_id", "level", "text")
    readonly_fields = fields
    ordering = ("id",)
    verbose_name_plural = "logs"

    @admin.display(description="message")
    def text(self, obj):
        if obj.message is not None:
            return obj.message
        return f"[{display.STREAMS.get(obj.stream_type, 'stream')}] " + bytes(obj.payload).decode("utf-8", "replace")


class BacktraceInline(ReadOnlyInline):
    """Where a workflow's code was when it wrote each blocking call (``t_backtrace``)."""

    model = ExecutionBacktrace
    fields = ("version_min_including", "version_max_excluding", "stack")
    readonly_fields = fields
    ordering = ("version_min_including",)
    verbose_name_plural = "backtraces"

    @admin.display(description="stack (innermost last)")
    def stack(self, obj):
        lines = [
            f"{frame['file']}:{frame['line']} in {frame['function']}: {frame['code']}" for frame in obj.backtrace.frames
        ]
        return format_html("<pre>{}</pre>", "\n".join(lines))


@admin.register(ExecutionState)
class ExecutionStateAdmin(ReadOnlyAdmin):
    list_display = (
        "execution_id",
        "ffqn",
        "status_badge",
        "created_at",
        "pending_expires_finished",
        "intermittent_event_count",
        "result",
    )
    list_filter = ("state", "lifecycle", "component_type", "is_top_level", "ffqn")
    search_fields = ("execution_id", "ffqn")
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    inlines = [EventInline, ResponseInline, LogInline, BacktraceInline]
    actions = ["cancel", "pause", "resume"]
    list_per_page = 50

    @admin.display(description="status", ordering="state")
    def status_badge(self, obj):
        colour = {"finished": "#2e7d32", "locked": "#1565c0", "cancelling": "#c62828", "paused": "#ef6c00"}.get(
            obj.status, "#555"
        )
        return format_html('<b style="color:{}">{}</b>', colour, obj.status)

    @admin.display(description="result")
    def result(self, obj):
        if not obj.is_finished:
            return "—"
        event = obj.events.filter(version=obj.corresponding_version).values_list("json_value", flat=True).first()
        return display.describe_retval(retval_from_json(event["finished"]["retval"])) if event else obj.result_kind

    def _apply(self, request, queryset, operation, verb):
        done = 0
        for execution_id in queryset.values_list("execution_id", flat=True):
            try:
                operation(execution_id)
                done += 1
            except errors.StoreError as error:
                self.message_user(request, f"{execution_id}: {error}", messages.WARNING)
        self.message_user(request, f"{verb} {done} execution(s).")

    @admin.action(description="Cancel selected executions")
    def cancel(self, request, queryset):
        self._apply(request, queryset, store.cancel, "Requested cancellation of")

    @admin.action(description="Pause selected executions")
    def pause(self, request, queryset):
        self._apply(request, queryset, store.pause_execution, "Paused")

    @admin.action(description="Resume selected executions")
    def resume(self, request, queryset):
        self._apply(request, queryset, store.unpause_execution, "Resumed")


@admin.register(Delay)
class DelayAdmin(ReadOnlyAdmin):
    list_display = ("delay_id", "execution", "join_set_id", "expires_at", "is_paused")
    list_filter = ("is_paused",)
    search_fields = ("delay_id",)


@admin.register(LogEntry)
class LogEntryAdmin(ReadOnlyAdmin):
    list_display = ("execution", "run_id", "created_at", "level", "message")
    list_filter = ("level",)
    search_fields = ("execution__execution_id", "message")
