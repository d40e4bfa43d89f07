"""The operator dashboard's numbers (the admin index), and the worker telemetry's reads.

Every query here stays cheap on a big ``t_state``:

- what matters *now* is exact and served by the partial indexes: due and scheduled
  pending executions (``t_state_pending_ffqn``), running ones and expired locks
  (``t_state_locked_expiry``), paused and cancelling ones (``t_state_lifecycle``), the
  oldest due execution (the head of ``t_state_pending_ffqn``);
- what finished in the last hour is exact too, by outcome: a range of
  ``t_state_finished_at`` read from the index alone (D93), the same condition as the
  list's "finished: last hour" filter (``listing.finished_since``), so a card's count and
  the list its link opens agree;
- the breakdown by state and by outcome over all time is counted over the newest
  ``WINDOW`` executions (a range of ``t_state_created``): exact while the table holds
  fewer, a bounded scan when it holds millions (``Dashboard.window_full`` says which; the
  dashboard then labels it);
- the executions waiting for code no live cluster serves (D111) are looked for among the
  ``NOT_SERVED_SCAN`` longest-due ones (the head of ``t_state_pending_ffqn``): such an
  execution stays due, so it is among the oldest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection

from executions.models import ExecutionState
from executions.outcome import FAILURE_OUTCOMES, outcome_of, outcome_of_result_kind
from executions.state_machine import Lifecycle, State
from executions.store.clusters import ClusterInfo, list_clusters, served_digests
from executions.store.common import utc_now
from executions.store.listing import finished_since

WINDOW = 100_000  # newest executions the breakdown by state and outcome covers
RECENT = timedelta(hours=1)
NOT_SERVED_SCAN = 10_000  # longest-due executions searched for unserved component digests


@dataclass(frozen=True)
class OldestPending:
    execution_id: str
    ffqn: str
    due_at: datetime
    age: timedelta  # how long it has been due


@dataclass(frozen=True)
class Dashboard:
    now: datetime
    # Exact, from the partial indexes: pending (due), scheduled, running, paused, cancelling.
    live: dict[str, int]
    expired_locks: int  # locked rows past their lock expiry (the sweep's next work)
    oldest_pending: OldestPending | None
    # Over the newest ``window`` executions (all of them unless ``window_full``).
    by_state: dict[str, int]  # t_state.state → count
    by_outcome: dict[str, int]  # outcome (executions.outcome) → count
    # Exact: every execution that finished in the hour before ``now`` (D93).
    finished_last_hour: dict[str, int]  # finished outcome → count
    window: int
    window_full: bool
    clusters: tuple[ClusterInfo, ...] = field(default=())
    # Due executions of component digests no live cluster serves, by digest (D111).
    not_served: dict[str, int] = field(default_factory=dict)

    @property
    def finished_last_hour_total(self) -> int:
        return sum(self.finished_last_hour.values())

    @property
    def failed_last_hour(self) -> int:
        """Execution failures (timed out, cancelled, uncategorized…; the ``failed`` filter)."""
        return sum(n for outcome, n in self.finished_last_hour.items() if outcome in FAILURE_OUTCOMES)

    @property
    def errors_last_hour(self) -> int:
        """Functions that returned an error value."""
        return self.finished_last_hour.get("error", 0)

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


def dashboard(now: datetime | None = None, *, window: int = WINDOW) -> Dashboard:
    """The dashboard's numbers at ``now`` (a handful of index-served queries)."""
    now = utc_now(now)
    by_state, by_outcome, counted = _breakdown(now, window)
    pending, scheduled = _pending_counts(now)
    running, expired = _locked_counts(now)
    lifecycles = dict(
        ExecutionState.objects.exclude(lifecycle=Lifecycle.ACTIVE)
        .values_list("lifecycle")
        .annotate(n=_count())
        .values_list("lifecycle", "n")
    )
    live = {
        "pending": pending,
        "scheduled": scheduled,
        "running": running,
        "paused": lifecycles.get(Lifecycle.PAUSED, 0),
        "cancelling": lifecycles.get(Lifecycle.CANCELLING, 0),
    }
    return Dashboard(
        now=now,
        live=live,
        expired_locks=expired,
        oldest_pending=oldest_pending(now),
        by_state=by_state,
        by_outcome=by_outcome,
        finished_last_hour=finished_since_by_outcome(now - RECENT),
        window=window,
        window_full=counted >= window,
        clusters=tuple(list_clusters(now=now)),
        not_served=not_served(now),
    )


def not_served(now: datetime | None = None, *, scan: int = NOT_SERVED_SCAN) -> dict[str, int]:
    """How many of the ``scan`` longest-due executions wait for a component digest that no
    live cluster serves, by digest (D111). Nothing when no cluster is alive: then every
    due execution waits for a worker, which the dashboard says otherwise."""
    now = utc_now(now)
    served = served_digests(now=now)
    if not served:
        return {}
    digests = _due(now).order_by("pending_expires_finished").values_list("component_id_input_digest", flat=True)
    counts: dict[str, int] = {}
    for digest in digests[:scan]:
        if digest not in served:
            counts[digest] = counts.get(digest, 0) + 1
    return counts


def oldest_pending(now: datetime | None = None) -> OldestPending | None:
    """The execution that has been due longest (the head of ``t_state_pending_ffqn``)."""
    now = utc_now(now)
    row = (
        _due(now)
        .order_by("pending_expires_finished")
        .values_list("execution_id", "ffqn", "pending_expires_finished")
        .first()
    )
    if row is None:
        return None
    return OldestPending(row[0], row[1], row[2], max(timedelta(0), now - row[2]))


def finished_since_by_outcome(since: datetime) -> dict[str, int]:
    """Executions finished at or after ``since``, by outcome: exact at any table size, from
    ``t_state_finished_at`` alone (D93)."""
    rows = (
        ExecutionState.objects.filter(finished_since(since))
        .values_list("result_kind")
        .annotate(n=_count())
        .values_list("result_kind", "n")
        .order_by()
    )
    counts: dict[str, int] = {}
    for result_kind, n in rows:
        outcome = outcome_of_result_kind(result_kind)
        counts[outcome] = counts.get(outcome, 0) + n
    return counts


def backlog(now: datetime | None = None) -> dict[str, int]:
    """Due pending executions per function (the telemetry's backlog gauge)."""
    now = utc_now(now)
    return dict(_due(now).values_list("ffqn").annotate(n=_count()).values_list("ffqn", "n"))


def first_scheduled_at(execution_ids: list[str]) -> dict[str, datetime]:
    """When each execution was first due (its submission, or the time it was scheduled
    for): the start of the telemetry's latency histogram. One primary-key read."""
    if not execution_ids:
        return {}
    return dict(ExecutionState.objects.filter(pk__in=execution_ids).values_list("execution_id", "first_scheduled_at"))


# -- internals ----------------------------------------------------------------------------


def _count():
    from django.db.models import Count

    return Count("*")


def _due(now: datetime):
    return ExecutionState.objects.filter(
        state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE, pending_expires_finished__lte=now
    )


def _pending_counts(now: datetime) -> tuple[int, int]:
    """(due, scheduled) active pending executions: one scan of ``t_state_pending_ffqn``."""
    sql = (
        "SELECT CASE WHEN pending_expires_finished <= %s THEN 1 ELSE 0 END AS due, COUNT(*)"
        " FROM t_state WHERE state = %s AND lifecycle = %s GROUP BY 1"
    )
    counts = dict(_rows(sql, [_dt(now), State.PENDING_AT.value, Lifecycle.ACTIVE.value]))
    return counts.get(1, 0), counts.get(0, 0)


def _locked_counts(now: datetime) -> tuple[int, int]:
    """(locked, of which expired): one scan of ``t_state_locked_expiry``."""
    sql = (
        "SELECT CASE WHEN pending_expires_finished < %s THEN 1 ELSE 0 END AS expired, COUNT(*)"
        " FROM t_state WHERE state = %s GROUP BY 1"
    )
    counts = dict(_rows(sql, [_dt(now), State.LOCKED.value]))
    return counts.get(0, 0) + counts.get(1, 0), counts.get(1, 0)


def _breakdown(now: datetime, window: int) -> tuple[dict[str, int], dict[str, int], int]:
    """By state and by outcome over the newest ``window`` executions: one GROUP BY over a
    ``t_state_created`` range."""
    sql = (
        "SELECT state, lifecycle, result_kind,"
        " CASE WHEN pending_expires_finished <= %s THEN 1 ELSE 0 END AS due,"
        " COUNT(*)"
        " FROM (SELECT state, lifecycle, result_kind, pending_expires_finished FROM t_state"
        " ORDER BY created_at DESC LIMIT %s) AS newest"
        " GROUP BY state, lifecycle, result_kind, due"
    )
    by_state: dict[str, int] = {}
    by_outcome: dict[str, int] = {}
    counted = 0
    later = now + timedelta(seconds=1)
    for state, lifecycle, result_kind, due, n in _rows(sql, [_dt(now), window]):
        counted += n
        by_state[state] = by_state.get(state, 0) + n
        outcome = outcome_of(state, lifecycle, result_kind, now if due else later, now)
        by_outcome[outcome] = by_outcome.get(outcome, 0) + n
    return by_state, by_outcome, counted


def _dt(value: datetime):
    return connection.ops.adapt_datetimefield_value(value)


def _rows(sql: str, params: list) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
