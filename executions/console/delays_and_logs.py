"""Two of the store's tables as plain read-only lists: the pending timers (``t_delay``) and
the log lines and std stream chunks of runs (``t_log``).

An execution's own delays and logs are on its page (``executions.console.page``); these
lists look across executions: which timers are due next, or a log line by its text.

why: D41 (logs), D90 (ids as they are in links)
"""

from __future__ import annotations

from django.contrib import admin

from executions import display
from executions.console.readonly import ReadOnlyAdminMixin
from executions.models import Delay, LogEntry


@admin.register(Delay)
class DelayAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("delay_id", "execution", "join_set_id", "expires", "is_paused")
    list_filter = ("is_paused",)
    search_fields = ("delay_id",)

    @admin.display(description="expires at (UTC)", ordering="expires_at")
    def expires(self, obj):
        return display.exact_time(obj.expires_at)


@admin.register(LogEntry)
class LogEntryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("execution", "run_id", "at", "level", "message")
    list_filter = ("level",)
    search_fields = ("execution__execution_id", "message")

    @admin.display(description="at (UTC)", ordering="created_at")
    def at(self, obj):
        return display.exact_time(obj.created_at)
