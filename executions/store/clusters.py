"""Worker clusters' heartbeats: who serves what (functions, deployment, component digests),
and who is gone."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from executions import outcome
from executions.models import ClusterHeartbeat, DeploymentComponent
from executions.state_machine import Lifecycle, State
from executions.store.common import utc_now, write_transaction

HEARTBEAT_INTERVAL = timedelta(seconds=5)
GONE_AFTER = 3 * HEARTBEAT_INTERVAL  # three missed reports


@dataclass(frozen=True)
class ClusterInfo:
    cluster_id: str
    hostname: str
    pid: int
    started_at: datetime
    last_seen_at: datetime
    stopped_at: datetime | None
    processes: int
    running: int
    functions: tuple[str, ...]
    deployment_id: str
    alive: bool  # reported within GONE_AFTER and not stopped


def record_heartbeat(
    cluster_id: str,
    *,
    hostname: str,
    pid: int,
    started_at: datetime,
    processes: int,
    running: int,
    functions: list[str],
    deployment_id: str,
    now: datetime | None = None,
) -> None:
    """Upsert the cluster's report (one row per cluster)."""
    now = utc_now(now)
    with write_transaction():
        ClusterHeartbeat.store_objects.update_or_create(
            cluster_id=cluster_id,
            defaults=dict(
                hostname=hostname,
                pid=pid,
                started_at=started_at,
                last_seen_at=now,
                stopped_at=None,
                processes=processes,
                running=running,
                functions=sorted(functions),
                deployment_id=deployment_id,
            ),
        )


def record_cluster_stopped(cluster_id: str, *, now: datetime | None = None) -> None:
    """A cluster that stops in order says so; the dashboard shows it gone at once."""
    now = utc_now(now)
    with write_transaction():
        ClusterHeartbeat.store_objects.filter(cluster_id=cluster_id).update(stopped_at=now, last_seen_at=now, running=0)


def list_clusters(*, now: datetime | None = None, include_gone_for: timedelta = timedelta(days=1)) -> list[ClusterInfo]:
    """Clusters seen within ``include_gone_for``, newest report first, each alive or gone."""
    now = utc_now(now)
    rows = ClusterHeartbeat.objects.filter(last_seen_at__gte=now - include_gone_for).order_by("-last_seen_at")
    return [
        ClusterInfo(
            r.cluster_id,
            r.hostname,
            r.pid,
            r.started_at,
            r.last_seen_at,
            r.stopped_at,
            r.processes,
            r.running,
            tuple(r.functions),
            r.deployment_id,
            alive=r.stopped_at is None and r.last_seen_at >= now - GONE_AFTER,
        )
        for r in rows
    ]


def waiting_for_code(state) -> str | None:
    """ "waiting for component sha256:… (not served)" for a due execution whose digest no live
    cluster serves, else None (``outcome.waiting_for_code``); the clusters are read only for
    a due one. One rule for the console, the API and the dashboard (D111)."""
    if state.state != State.PENDING_AT or state.lifecycle != Lifecycle.ACTIVE:
        return None
    return outcome.waiting_for_code(state, served_digests())


def served_digests(*, now: datetime | None = None) -> frozenset[str]:
    """The component digests some live cluster runs: those of its deployment's components.
    An execution pinned to any other digest waits, visibly, for a worker of its code (D111)."""
    now = utc_now(now)
    live = ClusterHeartbeat.objects.filter(stopped_at__isnull=True, last_seen_at__gte=now - GONE_AFTER)
    deployments = set(live.values_list("deployment_id", flat=True))
    digests = DeploymentComponent.objects.filter(deployment_id__in=deployments).values_list("component_id", flat=True)
    return frozenset(digests)
