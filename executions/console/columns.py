"""The executions list's rows: one narrow row per execution (id, function, outcome badge,
reason, exact creation time, duration), readable on a 1366 px screen.

``ExecutionChangeList`` reads a page's results in one store call and works out each row's
outcome once (``executions.outcome`` through ``store.ExecutionSnapshot``); the columns of
``ExecutionColumns`` read what it left on each row, or ask the store for a row alone. A
short list is read with a ``LIMIT`` too, so no read of the list is unbounded.

why: D90 (links with ids as they are), D94 (bounded reads)
"""

from __future__ import annotations

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html

from executions import display, store
from executions.console.readonly import RawIdChangeList
from executions.state_machine import State


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


class ExecutionColumns:
    """The list's columns, as methods of the executions admin (``list_display``)."""

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
