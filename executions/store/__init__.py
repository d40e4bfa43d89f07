"""The execution store: the only code that writes execution state (spec 000 §6–§7).

``from executions import store`` and call ``store.create``, ``store.append``,
``store.lock_pending``…: ``__all__`` is what callers use. The submodules, by concern:

- ``datatypes``: requests and results; ``common``: the helpers the modules share
  (transactions, row locks, checks, the small changes of a locked row);
- ``transitions``: how each event changes the tables (one handler per state-machine effect);
- the writes: ``create``, ``append``, ``responses`` (response delivery), ``claim`` (the
  terms and statements of a new lock), ``locking``, ``timers``, ``lifecycle``, ``audit``,
  ``clusters`` (heartbeats), ``retention`` (deleting old finished executions, whole trees,
  in batches: one transaction each, the one public function that is several),
  ``deployments`` (registering and activating deployments);
- the reads: ``reads``, ``listing``, ``search`` (by result text), ``dashboard``.

The models are read-only outside the store: ``Model.objects`` refuses writes, and the store
writes through ``Model.store_objects`` or its own SQL (``executions.models``).

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

from executions.store import schedules as _schedules
from executions.store import webhooks as _webhooks
from executions.store.append import (
    append,
    append_and_claim_children,
    append_batch,
    append_batch_create_new_execution,
    append_many,
)
from executions.store.audit import AuditRecord, audited, list_audit
from executions.store.clusters import (
    list_clusters,
    record_cluster_stopped,
    record_heartbeat,
    served_digests,
    waiting_for_code,
)
from executions.store.create import create, create_many
from executions.store.dashboard import backlog, dashboard, first_scheduled_at, not_served
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
    Fence,
    LockedExecution,
    LockTerms,
    LogRecord,
    Page,
    ParkedRuns,
    Response,
)
from executions.store.deployments import (
    DeploymentRecord,
    NewDeployment,
    activate_deployment,
    confirm_deployment,
    create_deployment,
    current_deployment,
    enqueue_deployment,
    gc_orphan_files,
    get_deployment_record,
    read_file,
    register_deployment,
    resolve_source_digest,
)
from executions.store.lifecycle import (
    cancel,
    cancel_children,
    finish_cancelled,
    get_cancelling,
    pause_execution,
    reschedule,
    unpause_execution,
    upgrade_execution_component,
    upsert_stub_response,
)
from executions.store.listing import filter_executions, in_flight_of_component, list_executions
from executions.store.local_call import answered, append_call
from executions.store.locking import extend_lock, lock_again, lock_one, lock_pending, with_history
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
from executions.store.responses import append_delay_response, pause_delay, unpause_delay
from executions.store.retention import delete_finished
from executions.store.schedules import *  # noqa: F403
from executions.store.search import find_by_result_text
from executions.store.timers import expire_lock, fire_delay, get_expired_timers, next_pending_at, next_timer_at
from executions.store.webhooks import *  # noqa: F403

__all__ = [
    "activate_deployment",
    "confirm_deployment",
    "create_deployment",
    "current_deployment",
    "DeploymentRecord",
    "enqueue_deployment",
    "gc_orphan_files",
    "get_deployment_record",
    "NewDeployment",
    "read_file",
    "register_deployment",
    "resolve_source_digest",
    "AppendItem",
    "AttemptFailed",
    "AuditRecord",
    "BlockingStack",
    "CancelOutcome",
    "ChildClaim",
    "CreateOutcome",
    "CreateRequest",
    "DelayOutcome",
    "EventRecord",
    "ExecutionDetail",
    "ExecutionFilter",
    "ExecutionLog",
    "ExecutionSnapshot",
    "Fence",
    "LockedExecution",
    "LockTerms",
    "LogRecord",
    "Page",
    "ParkedRuns",
    "Response",
    "STATUS_FILTERS",
    "answered",
    "append",
    "append_and_claim_children",
    "append_batch",
    "append_batch_create_new_execution",
    "append_call",
    "append_delay_response",
    "append_logs",
    "append_many",
    "audited",
    "backlog",
    "cancel",
    "cancel_children",
    "create",
    "create_many",
    "dashboard",
    "delete_finished",
    "expire_lock",
    "extend_lock",
    "filter_executions",
    "find_by_result_text",
    "finish_cancelled",
    "fire_delay",
    "first_scheduled_at",
    "get",
    "get_cancelling",
    "get_created",
    "get_detail",
    "get_event",
    "get_expired_timers",
    "get_finished_result",
    "get_finished_results",
    "get_last_event",
    "get_state",
    "get_tree",
    "in_flight_of_component",
    "list_audit",
    "list_backtraces",
    "list_clusters",
    "list_events",
    "list_executions",
    "list_logs",
    "list_responses",
    "lock_again",
    "lock_one",
    "lock_pending",
    "next_pending_at",
    "next_timer_at",
    "not_served",
    "pause_delay",
    "pause_execution",
    "record_cluster_stopped",
    "record_heartbeat",
    "reschedule",
    "responses_after",
    "served_digests",
    "unpause_delay",
    "unpause_execution",
    "upgrade_execution_component",
    "upsert_stub_response",
    "wait_for_finished",
    "wait_for_finished_result",
    "waiting_for_code",
    "with_history",
]
__all__ += _schedules.__all__ + _webhooks.__all__
