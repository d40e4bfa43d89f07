"""What starts executions from outside: schedules (a clock) and webhook calls (HTTP).

- ``Schedule`` (``t_schedule``): a target function with its arguments and a spec (cron,
  interval or both, in an IANA time zone); ``due_at`` is when the timer sweep must look at
  it next (its next tick, or a re-check of a buffered one).
- ``ScheduleTick`` (``t_schedule_tick``): what each tick did (started, skipped, buffered,
  missed, failed), newest kept; the console's "last ticks".
- ``WebhookKey`` (``t_webhook_key``): an endpoint's idempotency key and the execution id it
  stands for, unique, so a retried delivery gets the same execution.
- ``WebhookCall`` (``t_webhook_call``): every accepted call of an endpoint, with its status
  and the execution it started.

Only ``executions.store`` writes them. why: D113, D114, D115.
"""

from django.db import models
from django.db.models import CheckConstraint, Index, Q, UniqueConstraint

from executions.models.base import ExactJSONField, StoreTable

__all__ = [
    "OVERLAP_POLICIES",
    "Schedule",
    "ScheduleTick",
    "TICK_ACTIONS",
    "WebhookCall",
    "WebhookKey",
]

OVERLAP_POLICIES = ["skip", "buffer_one", "buffer_all", "allow_all", "cancel_other"]
TICK_ACTIONS = ["started", "skipped", "buffered", "missed", "failed", "superseded"]


class Schedule(StoreTable):
    """``t_schedule``: one schedule; ``schedule_id`` is the user's name for it."""

    schedule_id = models.CharField(primary_key=True, max_length=128)
    key = models.CharField(
        max_length=26, unique=True, help_text="A ULID fixed at creation: the seed of its ticks' execution ids."
    )
    ffqn = models.CharField(max_length=512)
    arguments = ExactJSONField(help_text="The call's arguments, as given (an array, or an object by name).")
    cron = models.CharField(max_length=256, blank=True, default="")
    interval_seconds = models.FloatField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    start_at = models.DateTimeField(null=True, blank=True)
    end_at = models.DateTimeField(null=True, blank=True)
    jitter_seconds = models.FloatField(default=0)
    overlap = models.CharField(max_length=16, default="skip", choices=[(p, p) for p in OVERLAP_POLICIES])
    catchup_window_seconds = models.FloatField(default=60)
    paused = models.BooleanField(default=False)
    pause_reason = models.TextField(blank=True, default="")
    source = models.CharField(max_length=8, default="runtime", help_text="code (declared with @schedule) or runtime")
    next_tick_at = models.DateTimeField(null=True, blank=True, help_text="The next nominal tick; none once ended.")
    due_at = models.DateTimeField(null=True, blank=True, help_text="When the timer sweep looks at it next.")
    buffered = models.JSONField(default=list, help_text="Nominal times of buffered ticks, oldest first.")
    running_execution_id = models.CharField(max_length=1024, blank=True, default="")
    last_tick_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "t_schedule"
        ordering = ["schedule_id"]
        indexes = [Index(fields=["due_at"], name="t_schedule_due", condition=Q(paused=False))]
        constraints = [
            CheckConstraint(condition=~Q(cron="") | Q(interval_seconds__isnull=False), name="t_schedule_has_spec"),
            CheckConstraint(
                condition=Q(interval_seconds__isnull=True) | Q(interval_seconds__gt=0),
                name="t_schedule_interval_gt_0",
            ),
        ]

    def __str__(self) -> str:
        return self.schedule_id


class ScheduleTick(StoreTable):
    """``t_schedule_tick``: one tick of a schedule and what it did."""

    schedule_id = models.CharField(max_length=128)
    nominal_at = models.DateTimeField(help_text="The tick's time by the spec (before jitter).")
    action = models.CharField(max_length=16, choices=[(a, a) for a in TICK_ACTIONS])
    execution_id = models.CharField(max_length=1024, blank=True, default="")
    manual = models.CharField(max_length=16, blank=True, default="", help_text="trigger or backfill, if not the clock")
    reason = models.TextField(blank=True, default="")
    recorded_at = models.DateTimeField()

    class Meta:
        db_table = "t_schedule_tick"
        ordering = ["schedule_id", "-nominal_at"]
        indexes = [Index(fields=["schedule_id", "-nominal_at"], name="t_schedule_tick_recent")]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.nominal_at:%Y-%m-%d %H:%M:%S} {self.action}"


class WebhookKey(StoreTable):
    """``t_webhook_key``: (endpoint, idempotency key) → the execution id it stands for."""

    endpoint = models.CharField(max_length=512)
    idempotency_key = models.CharField(max_length=256)
    execution_id = models.CharField(max_length=1024)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "t_webhook_key"
        constraints = [UniqueConstraint(fields=["endpoint", "idempotency_key"], name="t_webhook_key_unique")]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.idempotency_key}"


class WebhookCall(StoreTable):
    """``t_webhook_call``: one accepted call of a webhook endpoint."""

    call_id = models.CharField(primary_key=True, max_length=32, help_text="Whc_<ULID>, the X-Obelisk-Request-Id")
    endpoint = models.CharField(max_length=512, help_text="METHOD /path as declared")
    method = models.CharField(max_length=16)
    path = models.CharField(max_length=1024)
    received_at = models.DateTimeField()
    status = models.IntegerField()
    execution_id = models.CharField(max_length=1024, blank=True, default="")
    idempotency_key = models.CharField(max_length=256, blank=True, default="")
    error = models.TextField(blank=True, default="")
    duration_ms = models.FloatField(default=0)

    class Meta:
        db_table = "t_webhook_call"
        ordering = ["-received_at"]
        indexes = [
            Index(fields=["-received_at"], name="t_webhook_call_recent"),
            Index(fields=["execution_id"], name="t_webhook_call_execution"),
        ]

    def __str__(self) -> str:
        return f"{self.call_id} {self.endpoint} {self.status}"
