"""The execution tables: ``t_state``, the append-only ``t_execution_log``, join-set
responses, delays, logs, backtraces, the audit log and cluster heartbeats (spec 000 §2).
The differences from the seed are listed in ``executions/models/__init__.py``."""

from django.db import models
from django.db.models import CheckConstraint, Index, Q, UniqueConstraint

from executions.events import VARIANTS
from executions.models.base import COMPONENT_TYPES, ExactJSONField, StoreTable, choices
from executions.state_machine import Lifecycle, State, StateWords

__all__ = [
    "AuditEntry",
    "Backtrace",
    "ClusterHeartbeat",
    "Delay",
    "ExecutionBacktrace",
    "ExecutionEvent",
    "ExecutionState",
    "JoinSetResponse",
    "LogEntry",
]


class ExecutionState(StateWords, StoreTable):
    """``t_state``: one row per execution, the projection of its event log."""

    execution_id = models.CharField(primary_key=True, max_length=1024)
    is_top_level = models.BooleanField()
    corresponding_version = models.BigIntegerField(help_text="Version of the last event reflected here.")
    ffqn = models.CharField("function", max_length=512)
    created_at = models.DateTimeField()
    component_id_input_digest = models.CharField("component digest", max_length=71)
    component_type = models.CharField(max_length=16, choices=choices(COMPONENT_TYPES))
    first_scheduled_at = models.DateTimeField()
    deployment_id = models.CharField(max_length=30)
    pending_expires_finished = models.DateTimeField(
        help_text="pending: scheduled at; locked: lock expiry; blocked: run expiry; finished: finished at."
    )
    state = models.CharField(max_length=20, choices=choices(State))
    updated_at = models.DateTimeField()
    intermittent_event_count = models.IntegerField(default=0)
    max_retries = models.BigIntegerField(null=True, blank=True)
    retry_exp_backoff_millis = models.BigIntegerField(null=True, blank=True)
    last_lock_version = models.BigIntegerField(null=True, blank=True)
    executor_id = models.CharField(max_length=30, null=True, blank=True)
    run_id = models.CharField(max_length=30, null=True, blank=True)
    lock_generation = models.BigIntegerField(
        default=0, help_text="Fencing token: +1 for every new lock and every lock revoked by someone else."
    )
    join_set_id = models.CharField(max_length=512, null=True, blank=True)
    join_set_closing = models.BooleanField(null=True, blank=True)
    result_kind = models.CharField(max_length=128, null=True, blank=True)
    incompatible_digest = models.CharField(max_length=71, null=True, blank=True)
    lifecycle = models.CharField(max_length=10, choices=choices(Lifecycle), default=Lifecycle.ACTIVE)

    class Meta:
        db_table = "t_state"
        verbose_name = "execution"
        # Reading is Django's ``view_executionstate``; acting is one permission of its own.
        permissions = [("act_on_executions", "Can act on executions: submit, cancel, pause, resume, retry, stub")]
        constraints = [
            CheckConstraint(condition=Q(corresponding_version__gte=0), name="t_state_version_gte_0"),
            CheckConstraint(condition=Q(intermittent_event_count__gte=0), name="t_state_intermittent_gte_0"),
            CheckConstraint(condition=Q(lock_generation__gte=0), name="t_state_generation_gte_0"),
            CheckConstraint(condition=Q(state__in=list(State)), name="t_state_state_valid"),
            CheckConstraint(condition=Q(lifecycle__in=list(Lifecycle)), name="t_state_lifecycle_valid"),
            CheckConstraint(condition=Q(component_type__in=COMPONENT_TYPES), name="t_state_component_type_valid"),
            # spec 000 §4: the combinations CombinedState accepts.
            CheckConstraint(
                condition=~Q(state=State.LOCKED)
                | (
                    Q(last_lock_version__isnull=False, executor_id__isnull=False, run_id__isnull=False)
                    & ~Q(lifecycle=Lifecycle.PAUSED)
                ),
                name="t_state_locked_has_lock",
            ),
            CheckConstraint(
                condition=Q(state=State.LOCKED) | Q(last_lock_version__isnull=True),
                name="t_state_lock_version_only_locked",
            ),
            CheckConstraint(
                condition=(Q(state=State.FINISHED) & Q(result_kind__isnull=False))
                | (~Q(state=State.FINISHED) & Q(result_kind__isnull=True)),
                name="t_state_result_kind_iff_finished",
            ),
            CheckConstraint(
                condition=~Q(state=State.FINISHED)
                | Q(lifecycle=Lifecycle.ACTIVE, executor_id__isnull=True, run_id__isnull=True),
                name="t_state_finished_is_released",
            ),
            CheckConstraint(
                condition=(
                    Q(state=State.BLOCKED_BY_JOIN_SET) & Q(join_set_id__isnull=False, join_set_closing__isnull=False)
                )
                | (~Q(state=State.BLOCKED_BY_JOIN_SET) & Q(join_set_id__isnull=True, join_set_closing__isnull=True)),
                name="t_state_join_set_iff_blocked",
            ),
        ]
        indexes = [
            # Locking pending work by function (and its next-due time).
            Index(
                fields=["pending_expires_finished", "ffqn"],
                condition=Q(state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE),
                name="t_state_pending_ffqn",
            ),
            # Expired-lock scan of the timer sweep.
            Index(fields=["pending_expires_finished"], condition=Q(state=State.LOCKED), name="t_state_locked_expiry"),
            # The cancellation driver and the paused list.
            Index(
                fields=["lifecycle", "created_at"], condition=~Q(lifecycle=Lifecycle.ACTIVE), name="t_state_lifecycle"
            ),
            # Listing: newest first, by function, by deployment. Every state change rewrites
            # an entry in each index (no HOT updates: `state` is indexed), so only indexes
            # a query needs are kept.
            Index(fields=["created_at"], name="t_state_created"),
            # `varchar_pattern_ops` (D84): a function prefix (`LIKE 'prefix%'`) is a range of this
            # index whatever the server's collation; exact functions use it too.
            Index(
                fields=["ffqn", "created_at"],
                opclasses=["varchar_pattern_ops", "timestamptz_ops"],
                name="t_state_ffqn_created",
            ),
            Index(fields=["deployment_id", "created_at"], name="t_state_deployment"),
            Index(fields=["component_id_input_digest", "created_at"], name="t_state_component"),
            # An execution's tree (`<id>.%`, its children and theirs) is a range of the primary
            # key's `varchar_pattern_ops` index, which Django makes itself for a text primary
            # key on PostgreSQL (`t_state_execution_id_…_like`), whatever the server's
            # collation, as a function prefix is of the one above (D94). A second index of
            # the same (`t_state_id_prefix`, dropped by D128) only cost every write.
            # The console at a million rows (D93): what finished in a window, counted by
            # outcome from the index alone (the dashboard's last hour, the `finished` filter);
            # a finished outcome newest first; an unfinished state newest first; children
            # newest first (the list shows top-level ones unless asked, D94).
            Index(
                fields=["pending_expires_finished", "result_kind"],
                condition=Q(state=State.FINISHED),
                name="t_state_finished_at",
            ),
            Index(fields=["result_kind", "created_at"], condition=Q(state=State.FINISHED), name="t_state_outcome"),
            Index(fields=["state", "created_at"], condition=~Q(state=State.FINISHED), name="t_state_unfinished"),
            Index(fields=["created_at"], condition=Q(is_top_level=False), name="t_state_children"),
        ]

    def __str__(self) -> str:
        return self.execution_id


class ExecutionEvent(StoreTable):
    """``t_execution_log``: the append-only event log, versions contiguous from 0 (``Created``)."""

    # No constraint in the database (D75): only the store writes here, under the row's lock.
    execution = models.ForeignKey(
        ExecutionState,
        on_delete=models.CASCADE,
        db_column="execution_id",
        related_name="events",
        db_index=False,
        db_constraint=False,
    )
    version = models.BigIntegerField()
    created_at = models.DateTimeField()
    json_value = ExactJSONField()
    variant = models.CharField(max_length=32, choices=choices(VARIANTS))
    join_set_id = models.CharField(max_length=512, null=True, blank=True)
    history_event_type = models.CharField(max_length=20, null=True, blank=True)
    consumes_response = models.BooleanField(
        default=False,
        help_text="JoinNext, or JoinNextTry that found a response: takes the next response of its join set.",
    )

    class Meta:
        db_table = "t_execution_log"
        verbose_name = "event"
        ordering = ["execution_id", "version"]
        constraints = [
            UniqueConstraint(fields=["execution", "version"], name="t_execution_log_pk"),
            # A join set is created once per execution: its id names its children and delays.
            UniqueConstraint(
                fields=["execution", "join_set_id"],
                condition=Q(history_event_type="join_set_create"),
                name="t_execution_log_join_set_once",
            ),
            CheckConstraint(condition=Q(version__gte=0), name="t_execution_log_version_gte_0"),
            CheckConstraint(condition=Q(variant__in=list(VARIANTS)), name="t_execution_log_variant_valid"),
            CheckConstraint(
                condition=(Q(variant="history_event") & Q(history_event_type__isnull=False))
                | (~Q(variant="history_event") & Q(history_event_type__isnull=True)),
                name="t_execution_log_history_type_iff_history",
            ),
            CheckConstraint(
                condition=(Q(version=0) & Q(variant="created")) | (~Q(version=0) & ~Q(variant="created")),
                name="t_execution_log_created_iff_version_0",
            ),
        ]
        indexes = [
            # Reads by execution use the unique (execution_id, version) index.
            Index(
                fields=["execution", "join_set_id"],
                condition=Q(consumes_response=True),
                name="t_execution_log_join_next",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.execution_id}@{self.version} {self.variant}"


class JoinSetResponse(StoreTable):
    """``t_join_set_response``: child results and fired/cancelled delays delivered to a parent."""

    created_at = models.DateTimeField()
    execution = models.ForeignKey(
        ExecutionState,
        on_delete=models.CASCADE,
        db_column="execution_id",
        related_name="responses",
        db_index=False,
        db_constraint=False,  # D75, as the log's
        help_text="The parent (receiving) execution.",
    )
    join_set_id = models.CharField(max_length=512)
    delay_id = models.CharField(max_length=1024, null=True, blank=True)
    delay_success = models.BooleanField(null=True, blank=True)
    child_execution = models.ForeignKey(
        ExecutionState,
        on_delete=models.CASCADE,
        db_column="child_execution_id",
        related_name="+",
        null=True,
        blank=True,
        db_index=False,
        db_constraint=False,  # D75
    )
    finished_version = models.BigIntegerField(null=True, blank=True)
    seq = models.BigIntegerField(help_text="Per-parent ordinal from 1: the response cursor.")

    class Meta:
        db_table = "t_join_set_response"
        verbose_name = "join set response"
        ordering = ["execution_id", "seq"]
        constraints = [
            UniqueConstraint(fields=["execution", "seq"], name="t_join_set_response_seq"),
            UniqueConstraint(
                fields=["child_execution"], condition=Q(child_execution__isnull=False), name="t_join_set_response_child"
            ),
            UniqueConstraint(
                fields=["delay_id"], condition=Q(delay_id__isnull=False), name="t_join_set_response_delay"
            ),
            CheckConstraint(condition=Q(seq__gte=1), name="t_join_set_response_seq_gte_1"),
            CheckConstraint(
                condition=(
                    Q(delay_id__isnull=False, delay_success__isnull=False)
                    & Q(child_execution__isnull=True, finished_version__isnull=True)
                )
                | (
                    Q(delay_id__isnull=True, delay_success__isnull=True)
                    & Q(child_execution__isnull=False, finished_version__isnull=False)
                ),
                name="t_join_set_response_one_kind",
            ),
        ]
        indexes = [Index(fields=["execution", "join_set_id", "seq"], name="t_join_set_response_js")]

    def __str__(self) -> str:
        return f"{self.execution_id} #{self.seq} {self.child_execution_id or self.delay_id}"


class Delay(StoreTable):
    """``t_delay``: a pending durable timer; deleted when its response is written."""

    delay_id = models.CharField(primary_key=True, max_length=1024)
    execution = models.ForeignKey(
        ExecutionState, on_delete=models.CASCADE, db_column="execution_id", related_name="delays"
    )
    join_set_id = models.CharField(max_length=512)
    expires_at = models.DateTimeField()
    is_paused = models.BooleanField(default=False)

    class Meta:
        db_table = "t_delay"
        indexes = [Index(fields=["expires_at"], condition=Q(is_paused=False), name="t_delay_expires")]

    def __str__(self) -> str:
        return self.delay_id


class LogEntry(StoreTable):
    """``t_log``: a log record or a chunk of a std stream, written by a run."""

    LEVELS = [(1, "trace"), (2, "debug"), (3, "info"), (4, "warn"), (5, "error")]
    STREAMS = [(1, "stdout"), (2, "stderr")]

    execution = models.ForeignKey(
        ExecutionState, on_delete=models.CASCADE, db_column="execution_id", related_name="logs", db_index=False
    )
    run_id = models.CharField(max_length=30)
    created_at = models.DateTimeField()
    level = models.SmallIntegerField(choices=LEVELS, null=True, blank=True)
    message = models.TextField(null=True, blank=True)
    stream_type = models.SmallIntegerField(choices=STREAMS, null=True, blank=True)
    payload = models.BinaryField(null=True, blank=True)

    class Meta:
        db_table = "t_log"
        verbose_name = "log entry"
        verbose_name_plural = "log entries"
        constraints = [
            CheckConstraint(
                condition=(
                    Q(level__isnull=False, message__isnull=False) & Q(stream_type__isnull=True, payload__isnull=True)
                )
                | (Q(level__isnull=True, message__isnull=True) & Q(stream_type__isnull=False, payload__isnull=False)),
                name="t_log_log_or_stream",
            ),
        ]
        indexes = [
            Index(fields=["execution", "run_id", "created_at"], name="t_log_run"),
            Index(fields=["execution", "id"], name="t_log_cursor"),
        ]


class Backtrace(StoreTable):
    """``t_wasm_backtrace`` for Python: a deduplicated stack, keyed by ``01`` + SHA-256 of its frames."""

    backtrace_hash = models.CharField(primary_key=True, max_length=66)
    frames = models.JSONField()

    class Meta:
        db_table = "t_backtrace"


class ExecutionBacktrace(StoreTable):
    """``t_execution_backtrace``: the stack that wrote events ``[version_min_including, version_max_excluding)``."""

    execution = models.ForeignKey(
        ExecutionState, on_delete=models.CASCADE, db_column="execution_id", related_name="backtraces", db_index=False
    )
    component_id = models.JSONField()
    version_min_including = models.BigIntegerField()
    version_max_excluding = models.BigIntegerField()
    backtrace = models.ForeignKey(Backtrace, on_delete=models.PROTECT, db_column="backtrace_hash")

    class Meta:
        db_table = "t_execution_backtrace"
        constraints = [
            UniqueConstraint(
                fields=["execution", "version_min_including", "version_max_excluding"],
                name="t_execution_backtrace_pk",
            ),
            CheckConstraint(
                condition=Q(version_max_excluding__gt=models.F("version_min_including")),
                name="t_execution_backtrace_range",
            ),
        ]


class AuditEntry(StoreTable):
    """``t_audit``: who did what to an execution, from the console, the API or the CLI.

    Written by ``store.audited`` in the same transaction as the action's own events, so an
    action and its record commit together. ``execution_id`` is plain text, not a foreign
    key: the record outlives the execution when retention deletes it.
    """

    created_at = models.DateTimeField()
    actor = models.CharField(max_length=256, help_text="The user (or token owner) who acted.")
    via = models.CharField(max_length=16, help_text="admin, api or cli")
    action = models.CharField(max_length=32)
    execution_id = models.CharField(max_length=1024)
    detail = models.JSONField(default=dict)

    class Meta:
        db_table = "t_audit"
        verbose_name = "audit entry"
        verbose_name_plural = "audit entries"
        indexes = [Index(fields=["execution_id", "created_at"], name="t_audit_execution")]

    def __str__(self) -> str:
        return f"{self.actor} {self.action} {self.execution_id}"


class ClusterHeartbeat(StoreTable):
    """``t_cluster``: each worker cluster's last report, for the dashboard and ``/health``.

    A cluster upserts its row every few seconds while it runs and sets ``stopped_at`` when it
    stops in order; one whose ``last_seen_at`` is older than a few intervals is gone (killed,
    or its host lost). Written only through ``store.record_heartbeat``.
    """

    cluster_id = models.CharField(primary_key=True, max_length=64)
    hostname = models.CharField(max_length=256)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    stopped_at = models.DateTimeField(null=True, blank=True)
    processes = models.IntegerField(help_text="Worker processes of the cluster.")
    running = models.IntegerField(default=0, help_text="Executions running at the last report.")
    functions = models.JSONField(default=list, help_text="The functions the cluster serves.")
    deployment_id = models.CharField(max_length=30)

    class Meta:
        db_table = "t_cluster"
        verbose_name = "worker cluster"
        indexes = [Index(fields=["last_seen_at"], name="t_cluster_last_seen")]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid}"
