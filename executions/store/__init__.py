"""The execution store: the only code that writes execution state (spec 000 §6–§7).

``from executions import store`` and call ``store.create``, ``store.append``,
``store.lock_pending``…; the submodules split the API by concern:

- ``datatypes``: requests and results; ``common``: transactions, row locks, checks;
- ``transitions``: how each event changes the tables (the state machine's effects);
- ``create``, ``append``, ``responses``, ``locking``, ``timers``, ``lifecycle``: the writes;
- ``reads``, ``listing``: the reads.
- ``retention``: deleting old finished executions, whole trees, in batches (one
  transaction each; the one public function that is several).

Every public function is one database transaction: the log events it appends and the
``t_state`` projection it changes commit together or not at all, and any error leaves the
database as it was. Writers lock the execution's ``t_state`` row first (``SELECT … FOR
UPDATE``; the response path locks the *parent's* row, decision 11), then check, in this
order: the writer's fence (run id + lock generation, spec 004 §5.1), the state machine
(``state_machine.decide``), and the optimistic version fence (``version`` must be
``corresponding_version + 1``).

On SQLite the same code runs inside ``BEGIN IMMEDIATE`` transactions (see settings), which
serialise writers the way the seed's single writer thread does.

Notifications (``executions.notify``) are published inside each transaction and delivered
on commit.
"""

from executions.store.append import (
    append,
    append_and_claim_children,
    append_batch,
    append_batch_create_new_execution,
    append_many,
)
from executions.store.audit import AuditRecord, audited, list_audit
from executions.store.clusters import ClusterInfo, list_clusters, record_cluster_stopped, record_heartbeat
from executions.store.console_reads import find_by_result_text, last_failure_detail
from executions.store.create import create, create_many
from executions.store.dashboard import Dashboard, OldestPending, backlog, dashboard, first_scheduled_at
from executions.store.datatypes import (
    STATUS_FILTERS,
    AppendItem,
    AttemptFailed,
    BlockingStack,
    CancelOutcome,
    ChildClaim,
    CreateOutcome,
    CreateRequest,
    DelayOutcome,
    EventRecord,
    ExecutionDetail,
    ExecutionFilter,
    ExecutionLog,
    ExecutionSnapshot,
    ExpiredDelay,
    Fence,
    LockedExecution,
    LockTerms,
    LogRecord,
    Page,
    ParkedRuns,
    Response,
)
from executions.store.lifecycle import (
    cancel,
    cancel_children,
    finish_cancelled,
    get_cancelling,
    pause_execution,
    reschedule,
    unpause_execution,
    upsert_stub_response,
)
from executions.store.listing import (
    decode_cursor,
    encode_cursor,
    filter_executions,
    list_executions,
)
from executions.store.locking import extend_lock, lock_one, lock_pending, with_history
from executions.store.reads import (
    append_logs,
    get,
    get_created,
    get_detail,
    get_event,
    get_finished_result,
    get_finished_results,
    get_last_event,
    get_state,
    get_tree,
    list_backtraces,
    list_events,
    list_logs,
    list_responses,
    responses_after,
    wait_for_finished,
    wait_for_finished_result,
)
from executions.store.responses import append_delay_response, append_response_for_test, pause_delay, unpause_delay
from executions.store.retention import delete_finished
from executions.store.timers import expire_lock, fire_delay, get_expired_timers, next_pending_at, next_timer_at

__all__ = [
    "reschedule",
    "Dashboard",
    "OldestPending",
    "backlog",
    "dashboard",
    "first_scheduled_at",
    "ClusterInfo",
    "list_clusters",
    "record_cluster_stopped",
    "record_heartbeat",
    "AuditRecord",
    "ExecutionDetail",
    "ExecutionSnapshot",
    "LogRecord",
    "audited",
    "get_detail",
    "list_audit",
    "AppendItem",
    "AttemptFailed",
    "CancelOutcome",
    "ChildClaim",
    "CreateOutcome",
    "CreateRequest",
    "DelayOutcome",
    "EventRecord",
    "ExecutionFilter",
    "ExecutionLog",
    "ParkedRuns",
    "ExpiredDelay",
    "Fence",
    "LockTerms",
    "LockedExecution",
    "Page",
    "BlockingStack",
    "Response",
    "STATUS_FILTERS",
    "append",
    "append_and_claim_children",
    "append_batch",
    "append_batch_create_new_execution",
    "append_delay_response",
    "append_logs",
    "append_many",
    "append_response_for_test",
    "cancel",
    "cancel_children",
    "create",
    "create_many",
    "decode_cursor",
    "delete_finished",
    "encode_cursor",
    "expire_lock",
    "extend_lock",
    "filter_executions",
    "finish_cancelled",
    "fire_delay",
    "get",
    "get_cancelling",
    "get_created",
    "get_event",
    "get_expired_timers",
    "get_finished_result",
    "get_finished_results",
    "get_last_event",
    "get_state",
    "get_tree",
    "list_backtraces",
    "list_events",
    "list_executions",
    "list_logs",
    "list_responses",
    "lock_one",
    "lock_pending",
    "next_pending_at",
    "next_timer_at",
    "pause_delay",
    "pause_execution",
    "responses_after",
    "unpause_delay",
    "unpause_execution",
    "upsert_stub_response",
    "wait_for_finished",
    "wait_for_finished_result",
    "with_history",
    "find_by_result_text",
    "last_failure_detail",
]
