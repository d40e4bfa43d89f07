#!/usr/bin/env python
"""End-to-end benchmark on PostgreSQL, next to the server's own ceiling, in one run.

For 1 and 2 worker processes it measures, with a no-op activity:

- drain: N executions created pending before the workers start; executions/s from the
  first lock to the last finish (read from the event log), and events/s (3 per execution);
- one at a time: a client submits M executions one by one, then waits for all;
  executions/s from the first submit to the last result;
- latency: K single executions, submit → result seen by the client; p50 / p99.

Baseline, same run, same server: ``pgbench`` with a one-row insert transaction at the
same client counts (tx/s, and p50 / p99 from its per-transaction log).

Usage: python bench/run.py [--database-url postgres://postgres@127.0.0.1:5432/postgres]
The benchmark creates (and drops) its own database ``obelisk_bench`` on that server.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
BENCH_DB = "obelisk_bench"
FFQN = "bench:noop/ifc.noop"


def database_url(admin_url: str, name: str) -> str:
    parts = urlparse(admin_url)
    return urlunparse(parts._replace(path=f"/{name}"))


def recreate_database(admin_url: str) -> str:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {BENCH_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {BENCH_DB}")
    return database_url(admin_url, BENCH_DB)


def child_env(url: str) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        OBELISK_COMPONENT_MODULES="bench.components",
        OBELISK_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
    )
    return env


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


# ---------------------------------------------------------------------------------------
# Baseline: pgbench
# ---------------------------------------------------------------------------------------


def pgbench(url: str, clients: int, seconds: int) -> dict:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS pgbench_one_row (id bigserial PRIMARY KEY, payload text NOT NULL)")
    parts = urlparse(url)
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp, "insert.sql")
        script.write_text("INSERT INTO pgbench_one_row (payload) VALUES ('x');\n")
        out = subprocess.run(
            ["pgbench", "-n", "-h", parts.hostname, "-p", str(parts.port or 5432), "-U", parts.username or "postgres",
             "-c", str(clients), "-j", str(clients), "-T", str(seconds), "-f", str(script),
             "--log", f"--log-prefix={tmp}/log", parts.path.lstrip("/")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        tps = next(float(line.split("=")[1].split()[0]) for line in out.stdout.splitlines() if line.startswith("tps"))
        latencies = []
        for path in glob.glob(f"{tmp}/log*"):
            for line in Path(path).read_text().splitlines():
                latencies.append(int(line.split()[2]) / 1000.0)
    return {"tps": tps, "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99)}


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------


class Cluster:
    """``manage.py obelisk_worker`` in a subprocess."""

    def __init__(self, url: str, workers: int):
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "obelisk_worker", "--workers", str(workers)],
            cwd=ROOT,
            env=child_env(url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


def create_pending(count: int) -> list[str]:
    from executions import store
    from executions.ids import ExecutionId
    from workers.registry import load_components
    from workers.submission import current_deployment_id

    spec = load_components()[FFQN]
    deployment_id = current_deployment_id()
    ids = []
    for start in range(0, count, 1000):
        requests = [
            store.CreateRequest(
                execution_id=str(ExecutionId.generate()),
                ffqn=FFQN,
                params=[],
                component_id=spec.component_id,
                deployment_id=deployment_id,
            )
            for _ in range(min(1000, count - start))
        ]
        store.create_many(requests)
        ids.extend(r.execution_id for r in requests)
    return ids


def drain(url: str, workers: int, count: int) -> dict:
    from django.db.models import Max, Min

    from executions import store
    from executions.models import ExecutionEvent

    ids = create_pending(count)
    started = time.perf_counter()
    cluster = Cluster(url, workers)
    try:
        store.wait_for_finished(ids, timeout=600)
        wall = time.perf_counter() - started
    finally:
        cluster.stop()
    events = ExecutionEvent.objects.filter(execution_id__in=ids)
    first_lock = events.filter(variant="locked").aggregate(t=Min("created_at"))["t"]
    last_finish = events.filter(variant="finished").aggregate(t=Max("created_at"))["t"]
    seconds = (last_finish - first_lock).total_seconds()
    return {"exec_s": count / seconds, "events_s": 3 * count / seconds, "wall_s": wall}


def one_at_a_time(count: int) -> dict:
    from executions import store
    from workers.submission import submit

    started = time.perf_counter()
    ids = [submit(FFQN, [])[0] for _ in range(count)]
    submitted = time.perf_counter() - started
    store.wait_for_finished(ids, timeout=600)
    seconds = time.perf_counter() - started
    return {"exec_s": count / seconds, "submit_s": count / submitted}


def latency(count: int) -> dict:
    from executions import store
    from workers.submission import submit

    samples = []
    for _ in range(count):
        started = time.perf_counter()
        execution_id, _ = submit(FFQN, [])
        store.wait_for_finished_result(execution_id, timeout=60)
        samples.append((time.perf_counter() - started) * 1000)
    return {"p50": percentile(samples, 0.5), "p99": percentile(samples, 0.99), "mean": statistics.fmean(samples)}


def engine(url: str, workers: int, args) -> dict:
    result = {"drain": drain(url, workers, args.drain)}
    cluster = Cluster(url, workers)
    try:
        latency(20)  # warm-up: the cluster is up and every process has run once
        result["one_at_a_time"] = one_at_a_time(args.sequential)
        result["latency"] = latency(args.latency)
    finally:
        cluster.stop()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--drain", type=int, default=20000, help="executions in the drain run")
    parser.add_argument("--sequential", type=int, default=2000, help="executions submitted one at a time")
    parser.add_argument("--latency", type=int, default=500, help="single executions timed end to end")
    parser.add_argument("--pgbench-seconds", type=int, default=10)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    url = recreate_database(args.database_url)
    env = child_env(url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    rows = []
    for workers in args.workers:
        baseline = pgbench(url, workers, args.pgbench_seconds)
        measured = engine(url, workers, args)
        rows.append((workers, baseline, measured))
        print(f"done: {workers} worker(s)", file=sys.stderr)

    print(f"\nObelisk for Django, PostgreSQL at {urlparse(url).hostname}:{urlparse(url).port}, no-op activity")
    print(
        f"{'workers':>7} | {'pgbench 1-row insert':>28} | {'drain':>24} | {'one at a time':>15} | {'submit → result':>20} | ratio"
    )
    print(
        f"{'':>7} | {'tx/s   p50 / p99 ms':>28} | {'exec/s   events/s':>24} | {'exec/s':>15} | {'p50 / p99 ms':>20} | drain / pgbench"
    )
    for workers, b, m in rows:
        d, s, lat = m["drain"], m["one_at_a_time"], m["latency"]
        print(
            f"{workers:>7} | {b['tps']:>9,.0f}  {b['p50']:>7.2f} / {b['p99']:<7.2f} | "
            f"{d['exec_s']:>9,.0f}  {d['events_s']:>12,.0f} | {s['exec_s']:>15,.0f} | "
            f"{lat['p50']:>9.2f} / {lat['p99']:<8.2f} | {d['exec_s'] / b['tps']:.2f}"
        )
    print(
        "\n(drain: first lock to last finish, from the log; one at a time: first submit to last result;"
        " latency: submit to result seen by the client; pgbench clients = workers)"
    )


if __name__ == "__main__":
    main()
