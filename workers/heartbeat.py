"""A worker cluster's heartbeat: who it is, what it serves, how busy it is.

The ``obelisk_worker`` process reports its cluster every ``HEARTBEAT_INTERVAL`` (5 s) with
``store.record_heartbeat`` (``t_cluster``): a stable cluster id (``host:pid:ULID``), host,
pid, start time, worker processes, the functions it serves, its deployment, and how many
executions its worker processes are running. On an orderly stop it calls
``store.record_cluster_stopped``; a killed cluster simply stops reporting and shows as
gone after ``GONE_AFTER`` (the dashboard, ``store.list_clusters``).

*Running* is a counter the cluster's processes share (created here before django-q2 forks
them, like ``workers.lingering``): an executor adds a claimed batch when it starts running
it and takes it off when the batch is done (two increments per batch, not per execution),
a workflow run counts while its thread runs, not while it is parked (D77). Outside a
cluster (tests, scripts) the counter does not exist and counting costs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import socket
import threading
import time
from datetime import datetime

from django.db import close_old_connections, connection
from django.utils import timezone

from executions import store
from executions.ids import new_ulid
from executions.outage import DATABASE_ERRORS, Outage
from executions.store.clusters import HEARTBEAT_INTERVAL

logger = logging.getLogger("obelisk.heartbeat")

_running = None  # a multiprocessing Value shared by the cluster's processes (fork)


def prepare_cluster() -> None:
    """Create the shared counter in the ``obelisk_worker`` process, before the cluster forks."""
    global _running
    _running = multiprocessing.get_context("fork").Value("i", 0)


@contextlib.contextmanager
def running(count: int = 1):
    """Count ``count`` executions as running while the block runs (a negative count: as
    not running, inside a block that counts them, as a parked workflow run, D77)."""
    if _running is None or count == 0:
        yield
        return
    with _running.get_lock():
        _running.value += count
    try:
        yield
    finally:
        with _running.get_lock():
            _running.value -= count


def running_now() -> int:
    return max(0, _running.value) if _running is not None else 0


def new_cluster_id(hostname: str | None = None, pid: int | None = None) -> str:
    """``host:pid:ULID``, at most 64 characters (``t_cluster.cluster_id``)."""
    hostname = hostname or socket.gethostname()
    pid = os.getpid() if pid is None else pid
    suffix = f":{pid}:{new_ulid()}"
    return hostname[: 64 - len(suffix)] + suffix


class HeartbeatThread(threading.Thread):
    """Reports the cluster every ``interval`` seconds from the ``obelisk_worker`` process.

    A database outage is ridden out like the other loops (``executions.outage``): one log
    line, reports resume when the database is back. ``stop()`` ends the loop and records
    the cluster as stopped (one last write, on this thread's own connection)."""

    def __init__(
        self,
        *,
        processes: int,
        functions: list[str],
        deployment_id: str,
        interval: float = HEARTBEAT_INTERVAL.total_seconds(),
        cluster_id: str | None = None,
    ):
        super().__init__(name="obelisk-heartbeat", daemon=True)
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self.cluster_id = cluster_id or new_cluster_id(self.hostname, self.pid)
        self.started_at: datetime = timezone.now()
        self.processes = processes
        self.functions = sorted(functions)
        self.deployment_id = deployment_id
        self.interval = interval
        self.stopping = threading.Event()
        self.stopped = threading.Event()
        self.reports = 0
        self._outage = Outage(logger, "cluster heartbeat")

    def report(self) -> None:
        store.record_heartbeat(
            self.cluster_id,
            hostname=self.hostname,
            pid=self.pid,
            started_at=self.started_at,
            processes=self.processes,
            running=running_now(),
            functions=self.functions,
            deployment_id=self.deployment_id,
        )
        self.reports += 1

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                try:
                    self.report()
                    self._outage.recovered()
                    wait = self.interval
                except DATABASE_ERRORS as error:
                    wait = min(self.interval, self._outage.failed(error))
                except Exception:
                    logger.exception("cluster heartbeat failed; retrying")
                    connection.close()
                    wait = self.interval
                finally:
                    close_old_connections()
                self.stopping.wait(wait)
            self._record_stopped()
        finally:
            connection.close()
            self.stopped.set()

    def _record_stopped(self) -> None:
        for _ in range(3):  # brief: a stopping cluster does not wait out an outage
            try:
                store.record_cluster_stopped(self.cluster_id)
                return
            except DATABASE_ERRORS as error:
                time.sleep(self._outage.failed(error))
        logger.warning("could not record cluster %s as stopped; it shows as gone soon", self.cluster_id)

    def stop(self, timeout: float = 5.0) -> None:
        """End the loop and record the cluster as stopped (waits up to ``timeout``)."""
        self.stopping.set()
        if self.is_alive():
            self.stopped.wait(timeout)
