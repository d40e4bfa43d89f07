"""What bench/memory.py, bench/bigtables.py and bench/scaling.py share.

- ``own_database``: a benchmark database of the script's own (created, migrated, Django set
  up on it; dropped afterwards, also on error), named after the checkout and the process
  (``bench.run.own_database_name``, D106) so that no other run's is touched;
- ``running``: worker clusters (``bench.run.Clusters``) that are stopped whatever happens;
- ``drain``: like bench/run.py's (its ``wait_drained`` asks "unfinished" through the partial
  indexes of pending and locked rows, so the poll costs the same on a table of a million
  finished executions as on an empty one);
- ``server_counters``: writing transactions, WAL bytes and PostgreSQL's CPU seconds, to put
  a figure on what one execution costs the database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager

from bench.run import (
    FFQN,
    ROOT,
    Clusters,
    child_env,
    cpu_seconds,
    create_database,
    create_pending,
    drain_seconds,
    drop_own_database,
    load_average,
    note,
    own_database_name,
    postmaster_pid,
    process_tree,
    wait_drained,
)

ADMIN_URL = os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")

__all__ = [
    "ADMIN_URL",
    "FFQN",
    "drain",
    "load_average",
    "note",
    "own_database",
    "running",
    "server_counters",
    "wait_drained",
    "warm_up",
]


@contextmanager
def own_database(base: str, admin_url: str = ADMIN_URL):
    """Create and migrate a database of this run's own (``<base>_<checkout>_<pid>``, or
    ``OBELISK_BENCH_DATABASE_NAME``), set Django up on it, yield its URL; drop it at the
    end, whatever happened. A database that exists already is never dropped (D106)."""
    name = own_database_name(base)
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so clusters are stopped and the
    # database dropped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    note(f"benchmark database: {name}")
    url = create_database(admin_url, name)
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=child_env(url), check=True)
        os.environ.update(child_env(url))
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        yield url
    finally:
        if "django" in sys.modules and sys.modules["django"].apps.apps.ready:
            from django.db import connections

            from executions import notify

            notify.stop_listening()
            connections.close_all()
        drop_own_database(admin_url, name)


@contextmanager
def running(url: str, workers: int, count: int = 1):
    """``count`` clusters of ``workers`` processes, started, yielded, always stopped."""
    clusters = Clusters(url, workers, count)
    try:
        clusters.wait_started()
        yield clusters
    finally:
        clusters.stop()


def warm_up(clusters: Clusters, count: int = 50) -> None:
    from django.db import transaction

    with transaction.atomic():
        create_pending(count)
    wait_drained(clusters, timeout=120)
    time.sleep(0.5)


def server_counters() -> dict:
    """Server-wide: the next transaction id (only writing transactions take one; reading
    it takes none), the WAL position in bytes, and the CPU seconds of the PostgreSQL
    server's processes (when it runs on this machine). Other databases' work counts too."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint, pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')"
        )
        xid, wal = cursor.fetchone()
    root = postmaster_pid()
    pg_cpu = cpu_seconds(process_tree(root), root) if root else float("nan")
    return {"xid": int(xid), "wal": float(wal), "pg_cpu": pg_cpu}


def drain(clusters: Clusters, count: int) -> dict:
    """``count`` pending executions committed at once to warm ``clusters``; executions/s
    from the first ``Locked`` to the last ``Finished`` event, and what each execution cost:
    writing transactions, WAL bytes, CPU ms of PostgreSQL and of the clusters over the
    drain (from the commit of the pending rows to the poll that saw none left: claims and
    results); WAL bytes and PostgreSQL CPU ms of creating the pending rows, apart."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    created = server_counters()
    with transaction.atomic():
        ids = create_pending(count)
        before, cluster0 = server_counters(), clusters.cpu_seconds()
    wait_drained(clusters)
    after, cluster1 = server_counters(), clusters.cpu_seconds()
    seconds = drain_seconds(ids)
    return {
        "exec_s": count / seconds,
        "events_s": 3 * count / seconds,
        "write_tx_per_exec": (after["xid"] - before["xid"]) / count,
        "wal_per_exec": (after["wal"] - before["wal"]) / count,
        "pg_cpu_ms": (after["pg_cpu"] - before["pg_cpu"]) * 1000 / count,
        # creating the pending rows (batches of 1,000 rows per INSERT, one transaction)
        "create_wal_per_exec": (before["wal"] - created["wal"]) / count,
        "create_pg_cpu_ms": (before["pg_cpu"] - created["pg_cpu"]) * 1000 / count,
        "cluster_cpu_ms": (cluster1 - cluster0) * 1000 / count,
    }
