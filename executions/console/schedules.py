"""Schedules in the operator console: what each one starts and when, what its last ticks
did, and pause / resume / trigger (issue 39).

- The list: one row per schedule with its target, its spec (cron or interval, in its time
  zone), the overlap policy, active or paused (with the reason: a schedule whose target no
  longer fits says "paused: cannot submit …"), the next five fire times in its zone and
  in UTC, and its last ticks as badges. A started tick is its execution's outcome badge
  (``executions.display``), the others (skipped, missed, failed, buffered, superseded) a
  badge of their own; each links to the tick's execution when there is one.
  ``ScheduleChangeList`` reads the ticks' executions of a page in one query.
- The page (``<schedule>/``): the same, with the spec in full, more ticks and the
  schedule's audit trail.
- The buttons POST (with Django's CSRF token) to ``<schedule>/act/<action>/``; they act
  through ``executions.schedules`` with ``via="admin"`` and the user as the actor, so each
  is audited under ``schedule:<id>`` in its own transaction, and need
  ``obelisk_executions.act_on_executions``. A GET there changes nothing.

Read-only otherwise, like every console page (``executions.console.readonly``). Registered
by ``executions.admin``.

why: D51 (actions through the store, audited), D90 (ids as they are in links), D113 (ticks
are ordinary executions), D116 (the audit subject ``schedule:<id>``)
"""

from __future__ import annotations

from datetime import UTC
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from executions import display, errors, schedules, store
from executions.console.actions import ACT_PERMISSION
from executions.console.readonly import RawIdChangeList, ReadOnlyAdminMixin
from executions.console.urls import execution_url
from executions.models import ExecutionState, Schedule
from executions.store.audit import SCHEDULE_SUBJECT

VIEW_EXECUTIONS = "obelisk_executions.view_executionstate"
TICKS_IN_LIST = 10  # the newest ticks of each row of the list
TICKS_ON_PAGE = 50  # the newest ticks on a schedule's page
AUDIT_ON_PAGE = 20
FIRE_TIMES = 5
ACTIONS = {"pause": "Pause", "resume": "Resume", "trigger": "Trigger now"}  # in the buttons' order
# Colours of the badges of ticks that started nothing: background, text.
TICK_COLOURS: dict[str, tuple[str, str]] = {
    "skipped": ("#9e9e9e", "#fff"),
    "missed": ("#6d4c41", "#fff"),
    "failed": ("#c62828", "#fff"),
    "buffered": ("#00838f", "#fff"),
    "superseded": ("#757575", "#fff"),
    "started": ("#546e7a", "#fff"),  # started, but its execution is gone (retention)
}
STATUS_COLOURS = {"active": ("#2e7d32", "#fff"), "paused": ("#f9a825", "#222")}


# -- what a schedule is, in words ------------------------------------------------------------


def _every(seconds: float) -> str:
    """``every 10 s``, ``every 5 min``, ``every 2 h``, ``every 1 d``; ``every 1.5 s``."""
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"every {int(seconds // size)} {unit}"
    return f"every {seconds:g} s"


def spec_text(row: Schedule) -> str:
    """``cron 0 2 * * * + every 10 s, Europe/Prague``: the spec on one line."""
    parts = []
    if row.cron:
        parts.append(f"cron {row.cron}")
    if row.interval_seconds is not None:
        parts.append(_every(row.interval_seconds))
    return f"{' + '.join(parts)}, {row.timezone}"


def _zone(row: Schedule):
    try:
        return ZoneInfo(row.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        return UTC


def zoned_time(row: Schedule, at) -> str:
    """``2026-12-07 02:30:00 CET (01:30:00 UTC)`` in the schedule's zone and in UTC; just
    ``… UTC`` for a UTC schedule."""
    utc = at.astimezone(UTC)
    if row.timezone == "UTC":
        return f"{utc:%Y-%m-%d %H:%M:%S} UTC"
    local = at.astimezone(_zone(row))
    if local.date() == utc.date():
        return f"{local:%Y-%m-%d %H:%M:%S %Z} ({utc:%H:%M:%S} UTC)"
    return f"{local:%Y-%m-%d %H:%M:%S %Z} ({utc:%Y-%m-%d %H:%M:%S} UTC)"


def status_badge(row: Schedule, limit: int = 90):
    """``active``, or ``paused`` and its reason (cut at ``limit`` characters; the whole of
    it is the title)."""
    word = "paused" if row.paused else "active"
    background, colour = STATUS_COLOURS[word]
    badge = format_html(
        '<span class="obelisk-badge obelisk-schedule-{}" style="background:{};color:{}">{}</span>',
        word,
        background,
        colour,
        word,
    )
    if row.paused and row.pause_reason:
        return format_html(
            '{} <span class="obelisk-pause-reason" title="{}">paused: {}</span>',
            badge,
            row.pause_reason,
            row.pause_reason if len(row.pause_reason) <= limit else row.pause_reason[: limit - 1] + "…",
        )
    return badge


def fire_times(row: Schedule) -> list[str]:
    """The next five fire times, in its zone and in UTC; none while paused or ended."""
    return [zoned_time(row, at) for at in schedules.next_fire_times(row, FIRE_TIMES)]


# -- ticks -----------------------------------------------------------------------------------


def tick_outcomes(ticks) -> dict[str, str]:
    """Execution id → outcome word of the ticks' executions, in one read by primary key."""
    ids = sorted({t.execution_id for t in ticks if t.execution_id})
    if not ids:
        return {}
    now = timezone.now()
    rows = ExecutionState.objects.filter(execution_id__in=ids)
    return {row.execution_id: store.ExecutionSnapshot.of(row).outcome(now) for row in rows}


def tick_word(tick, outcomes: dict[str, str]) -> str:
    """What a tick shows: its execution's outcome when it started one that exists, else
    what it did."""
    if tick.action == "started" and tick.execution_id in outcomes:
        return outcomes[tick.execution_id]
    return tick.action


def tick_badge(row: Schedule, tick, outcomes: dict[str, str]):
    """A tick as a badge titled with its time and what it did; a link to its execution
    when there is one."""
    word = tick_word(tick, outcomes)
    if tick.action == "started" and tick.execution_id in outcomes:
        badge = display.outcome_badge(word)
    else:
        background, colour = TICK_COLOURS.get(word, ("#555", "#fff"))
        badge = format_html(
            '<span class="obelisk-badge obelisk-tick-{}" style="background:{};color:{}">{}</span>',
            word,
            background,
            colour,
            word,
        )
    title = f"tick {zoned_time(row, tick.nominal_at)}: {tick.action}"
    if tick.manual:
        title += f" ({tick.manual})"
    if tick.reason:
        title += f": {tick.reason}"
    if tick.execution_id:
        return format_html(
            '<a class="obelisk-tick" href="{}" title="{}">{}</a>', execution_url(tick.execution_id), title, badge
        )
    return format_html('<span class="obelisk-tick" title="{}">{}</span>', title, badge)


class ScheduleChangeList(RawIdChangeList):
    """Reads each row's newest ticks and the outcomes of a page's tick executions in one
    query: the list costs one tick read per schedule shown, not one per tick."""

    def get_results(self, request):
        super().get_results(request)
        self.result_list = list(self.result_list)
        ticks = {row.schedule_id: schedules.ticks(row.schedule_id, limit=TICKS_IN_LIST) for row in self.result_list}
        outcomes = tick_outcomes([t for row_ticks in ticks.values() for t in row_ticks])
        for row in self.result_list:
            row.console_ticks = ticks[row.schedule_id]
            row.console_outcomes = outcomes


# -- the pages -------------------------------------------------------------------------------


def act_url(schedule_id: str, action: str) -> str:
    return reverse("admin:obelisk_executions_schedule_act", args=[schedule_id, action])


def schedule_url(schedule_id: str) -> str:
    return reverse("admin:obelisk_executions_schedule_change", args=[schedule_id])


def schedule_id_of(object_id: str) -> str:
    """The schedule id in a console URL: as it is (D90), or in the admin's ``_5F`` escaping
    of a link the admin itself made."""
    if Schedule.objects.filter(schedule_id=object_id).exists():
        return object_id
    return unquote(object_id)


def perform(action: str, schedule_id: str, actor: str) -> tuple[str, str | None]:
    """Do ``action`` through ``executions.schedules`` as ``actor`` via the console;
    ``(message, the started execution's id or None)``. Raises the store's error."""
    if action == "pause":
        changed = schedules.pause(schedule_id, reason=f"paused by {actor} in the console", actor=actor, via="admin")
        return ("Paused: no tick fires until it is resumed." if changed else "It was paused already."), None
    if action == "resume":
        changed = schedules.resume(schedule_id, actor=actor, via="admin")
        return ("Resumed: it fires from its next tick on." if changed else "It was active already."), None
    if action == "trigger":
        execution_id = schedules.trigger(schedule_id, actor=actor, via="admin")
        return f"Triggered: started {execution_id}.", execution_id
    raise Http404("unknown action")


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("schedule", "target", "spec", "overlap", "status", "next_fire_times", "last_ticks")
    list_display_links = ("schedule",)
    list_filter = ()  # a filter sidebar would push the ticks off a 1366 px screen; search instead
    search_fields = ("schedule_id", "ffqn")
    search_help_text = "A schedule id or a function (or part of one), or `paused`."
    ordering = ("schedule_id",)
    sortable_by = ("schedule",)
    list_per_page = 50
    show_facets = admin.ShowFacets.NEVER
    actions = None
    change_form_template = "admin/obelisk_executions/schedule/change_form.html"

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW_EXECUTIONS) or super().has_view_permission(request, obj)

    def has_module_permission(self, request):
        return self.has_view_permission(request)

    def has_act_permission(self, request) -> bool:
        return request.user.has_perm(ACT_PERMISSION)

    def get_changelist(self, request, **kwargs):
        return ScheduleChangeList

    def get_search_results(self, request, queryset, search_term):
        """``paused`` or ``active`` finds the schedules so; anything else an id or a function."""
        word = search_term.strip().lower()
        if word in ("paused", "active"):
            return queryset.filter(paused=word == "paused"), False
        return super().get_search_results(request, queryset, search_term)

    def changelist_view(self, request, extra_context=None):
        # The sidebar would squeeze the fire times and the ticks on a 1366 px screen.
        return super().changelist_view(request, {"is_nav_sidebar_enabled": False, **(extra_context or {})})

    # -- the list's columns

    @admin.display(description="schedule", ordering="schedule_id")
    def schedule(self, obj):
        return format_html('<span class="obelisk-id">{}</span>', obj.schedule_id)

    @admin.display(description="target")
    def target(self, obj):
        return format_html('<code title="{}">{}</code>', display.short_json(obj.arguments, 500), obj.ffqn)

    @admin.display(description="spec")
    def spec(self, obj):
        return format_html('<span class="obelisk-spec">{}</span>', spec_text(obj))

    @admin.display(description="status")
    def status(self, obj):
        return status_badge(obj)

    @admin.display(description="next fire times")
    def next_fire_times(self, obj):
        times = fire_times(obj)
        if not times:
            return format_html('<span class="obelisk-muted">{}</span>', "none while paused" if obj.paused else "none")
        return format_html_join("", '<div class="obelisk-time">{}</div>', ((t,) for t in times))

    @admin.display(description="last ticks (newest first)")
    def last_ticks(self, obj):
        ticks = getattr(obj, "console_ticks", None)
        if ticks is None:
            ticks = schedules.ticks(obj.schedule_id, limit=TICKS_IN_LIST)
        outcomes = getattr(obj, "console_outcomes", None)
        if outcomes is None:
            outcomes = tick_outcomes(ticks)
        if not ticks:
            return format_html('<span class="obelisk-muted">{}</span>', "none yet")
        return format_html_join(" ", "{}", ((tick_badge(obj, t, outcomes),) for t in ticks))

    # -- the page and the buttons

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
            row = schedules.get(schedule_id_of(object_id))
        except errors.NotFound:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        ticks = schedules.ticks(row.schedule_id, limit=TICKS_ON_PAGE)
        outcomes = tick_outcomes(ticks)
        can_act = self.has_act_permission(request)
        context = {
            **self.admin_site.each_context(request),
            "is_nav_sidebar_enabled": False,
            "opts": self.opts,
            "title": f"Schedule {row.schedule_id}",
            "subtitle": None,
            "has_view_permission": True,
            "schedule": row,
            "spec": spec_text(row),
            "status": status_badge(row, limit=2000),
            "fire_times": fire_times(row),
            "details": _details(row),
            "ticks": [_tick_row(row, t, outcomes) for t in ticks],
            "audit": [
                (
                    display.exact_time(a.created_at),
                    a.actor,
                    a.via,
                    a.action,
                    display.short_json(a.detail, 200) if a.detail else "",
                )
                for a in store.list_audit(SCHEDULE_SUBJECT + row.schedule_id, limit=AUDIT_ON_PAGE)
            ],
            "buttons": _buttons(row) if can_act else [],
            "list_url": reverse("admin:obelisk_executions_schedule_changelist"),
            **(extra_context or {}),
        }
        return TemplateResponse(request, self.change_form_template, context)

    def act_view(self, request, object_id, action):
        """POST acts and goes back to the schedule's page with a message; anything else
        changes nothing."""
        if action not in ACTIONS:
            raise Http404("unknown action")
        if not self.has_act_permission(request):
            raise PermissionDenied
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        schedule_id = schedule_id_of(object_id)
        try:
            text, _ = perform(action, schedule_id, request.user.get_username())
        except errors.NotFound:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        except errors.StoreError as error:
            messages.error(request, f"{ACTIONS[action]} failed: {error}")
        else:
            messages.success(request, text)
        return HttpResponseRedirect(schedule_url(schedule_id))


def _buttons(row: Schedule) -> list[tuple[str, str, str]]:
    """``(name, label, URL)`` of the buttons that apply: pause or resume, and trigger."""
    names = ["resume" if row.paused else "pause", "trigger"]
    return [(name, ACTIONS[name], act_url(row.schedule_id, name)) for name in names]


def _details(row: Schedule) -> list[tuple[str, str]]:
    """The spec and settings in full, as (label, text) rows."""
    return [
        ("Target", row.ffqn),
        ("Arguments", display.short_json(row.arguments, 1000)),
        ("Cron", row.cron or "—"),
        ("Interval", _every(row.interval_seconds) if row.interval_seconds is not None else "—"),
        ("Time zone", row.timezone),
        ("Starts", zoned_time(row, row.start_at) if row.start_at else "—"),
        ("Ends", zoned_time(row, row.end_at) if row.end_at else "—"),
        ("Jitter", display.format_duration(row.jitter_seconds) if row.jitter_seconds else "none"),
        ("Overlap", row.overlap.replace("_", " ")),
        ("Catch-up window", display.format_duration(row.catchup_window_seconds)),
        ("Declared", "in code (@schedule)" if row.source == "code" else "at run time"),
        ("Last tick", zoned_time(row, row.last_tick_at) if row.last_tick_at else "—"),
        ("Created (UTC)", display.exact_time(row.created_at)),
        ("Changed (UTC)", display.exact_time(row.updated_at)),
    ]


def _tick_row(row: Schedule, tick, outcomes: dict[str, str]) -> dict:
    return {
        "at": zoned_time(row, tick.nominal_at),
        "action": tick.action,
        "manual": tick.manual,
        "badge": tick_badge(row, tick, outcomes),
        "execution_id": tick.execution_id,
        "execution_url": execution_url(tick.execution_id) if tick.execution_id else "",
        "reason": tick.reason,
        "recorded": display.exact_time(tick.recorded_at),
    }
