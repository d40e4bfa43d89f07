#!/usr/bin/env python
"""End-to-end benchmark on PostgreSQL, next to same-run baselines, as one table of ratios.

With a no-op activity it measures:

- drain, for 1, 2 and 4 worker processes (one cluster; ``--clusters 2x2`` adds several
  clusters): N pending executions made visible in one commit to a warm cluster;
  executions/s from the first lock to the last finish (read from the event log, 3 events per
  execution); CPU per execution of the whole machine (non-idle jiffies of every CPU in
  /proc/stat) and of the worker cluster (utime + stime of its process tree); the cluster's
  resident memory right after the drain (sum and largest process);
- one at a time (1 and 2 workers): a client submits M executions one by one, then waits
  for all; executions/s from the first submit to the last result;
- latency (1 and 2 workers): K single executions, submit → result seen by the client;
  p50 / p99.

Baselines, same run, same server:

- ``pgbench`` with a one-row insert transaction, 1 and 2 clients (tx/s, p50 / p99), and with
  1 client and ``synchronous_commit = off`` (how much of it is the wait for the flush);
- q2claim (``../shared/baselines/q2claim`` next to this repository, or ``--q2claim DIR``; its
  run.sh's steps, run as subprocesses on a database of this run's own): design A, a
  django-q2 cluster of 2 workers claiming batches with ``FOR UPDATE SKIP LOCKED``, woken by
  LISTEN/NOTIFY, on a one-table toy; design B, the same claims from 2 plain processes
  without django-q2. Throughput and p50 / p99.

Ratios and the issue's targets (issue 13): drain with 2 workers ≥ 0.6 × design A; one at a
time ≥ 0.25 × pgbench 1 client; submit → result p50 ≤ 1.3 × design A's p50; p99 ≤ 20 ms.

``--runs 3`` repeats the whole measurement (a fresh database each time) and prints
min / median / max per cell; verdicts use the median.

Usage: python bench/run.py [--database-url postgres://postgres@127.0.0.1:5432/postgres] [--runs 3]

Databases (D106): the benchmark creates its own on that server, named after the checkout and
the process (``obelisk_bench_<checkout hash>_<pid>``, and the same with ``_q2claim`` for the
baseline's), or ``OBELISK_BENCH_DATABASE_NAME``; it never drops a database it did not
create (one that exists already is refused), and drops its own at the end (``--keep``: not
the engine's), so two checkouts or two runs on one server leave each other alone.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parent.parent
# Eight hex digits of the checkout's path: part of every database name the benchmarks make.
CHECKOUT_TAG = hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]
FFQN = "bench:noop/ifc.noop"
# The q2claim baseline, next to this repository (``--q2claim`` or ``Q2CLAIM_DIR`` override it).
Q2CLAIM_DIR = Path(os.environ.get("Q2CLAIM_DIR", ROOT.parent / "shared" / "baselines" / "q2claim"))

# The targets.
DRAIN_VS_A = 0.6  # drain, 2 workers ≥ 0.6 × design A
SERIAL_VS_PGBENCH = 0.25  # one at a time ≥ 0.25 × pgbench, 1 client
P50_VS_A = 1.3  # submit → result p50 ≤ 1.3 × design A's p50
P99_MS = 20.0  # submit → result p99 ≤ 20 ms


def database_url(admin_url: str, name: str) -> str:
    parts = urlparse(admin_url)
    return urlunparse(parts._replace(path=f"/{name}"))


def own_database_name(base: str) -> str:
    """A database name no other checkout or run holds: ``<base>_<checkout>_<pid>``, or
    ``OBELISK_BENCH_DATABASE_NAME`` (D106). A fixed name, dropped and recreated WITH (FORCE)
    by every run, killed any other run on the same server."""
    name = os.environ.get("OBELISK_BENCH_DATABASE_NAME") or f"{base}_{CHECKOUT_TAG}_{os.getpid()}"
    if not re.fullmatch(r"[a-z_][a-z0-9_]{0,54}", name):  # + "_q2claim" (the baseline's) fits in 63
        raise SystemExit(f"database name {name!r}: lower-case letters, digits and _, at most 55 characters")
    return name


BENCH_DB = own_database_name("obelisk_bench")
_CREATED: set[str] = set()  # databases this process created: the only ones it drops


def create_database(admin_url: str, name: str) -> str:
    """``CREATE DATABASE name`` and its URL. Never drops first: a database of that name that
    exists already belongs to another run (or to someone), so this run stops instead."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        try:
            conn.execute(f"CREATE DATABASE {name}")
        except psycopg.errors.DuplicateDatabase:
            raise SystemExit(
                f"database {name} exists already on this server; it is not this run's, so it is left alone "
                "(set OBELISK_BENCH_DATABASE_NAME to another name, or drop it yourself)"
            ) from None
    _CREATED.add(name)
    return database_url(admin_url, name)


def drop_own_database(admin_url: str, name: str) -> None:
    """Drop ``name`` if, and only if, this process created it (its own clusters may still be
    connected: WITH (FORCE))."""
    if name not in _CREATED:
        return
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    _CREATED.discard(name)


def recreate_database(admin_url: str) -> str:
    """A fresh ``BENCH_DB`` for each run of ``--runs``: the previous run's (this process's) is dropped."""
    drop_own_database(admin_url, BENCH_DB)
    return create_database(admin_url, BENCH_DB)


def child_env(url: str) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        OBELISK_COMPONENT_MODULES="bench.components",
        OBELISK_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
        DJANGO_DEBUG="0",  # measured as deployed: with DEBUG Django times and keeps every query
    )
    return env


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# CPU and memory from /proc (no psutil); bench/workflows.py uses these too
# ---------------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[str, list[str]] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    return comm, raw[raw.rindex(")") + 2 :].split()


def _all_parents() -> dict[int, tuple[int, str]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            out[int(entry)] = (int(stat[1][1]), stat[0])
    return out


def process_tree(root: int) -> list[int]:
    parents = _all_parents()
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, (ppid, _) in parents.items() if ppid in frontier]
        tree.extend(frontier)
    return tree


def cpu_seconds(pids: list[int], root: int) -> float:
    """utime + stime of every live process, plus the reaped children of the root."""
    total = 0
    for pid in pids:
        stat = _stat(pid)
        if stat is None:
            continue
        fields = stat[1]
        total += int(fields[11]) + int(fields[12])
        if pid == root:
            total += int(fields[13]) + int(fields[14])
    return total / TICK


def rss_mib(pids: list[int]) -> tuple[float, float]:
    """(sum, largest) VmRSS of the processes, MiB."""
    sizes = []
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    sizes.append(int(line.split()[1]) / 1024)
        except OSError:
            pass
    return (sum(sizes), max(sizes)) if sizes else (0.0, 0.0)


def postmaster_pid() -> int | None:
    """The PostgreSQL server's root process, if it runs on this machine."""
    parents = _all_parents()
    for pid, (ppid, comm) in parents.items():
        if comm in ("postgres", "postmaster") and parents.get(ppid, (0, ""))[1] not in ("postgres", "postmaster"):
            return pid
    return None


def machine_busy_seconds() -> float:
    """Non-idle CPU time of the whole machine since boot, summed over every CPU, in seconds
    (/proc/stat: user + nice + system + irq + softirq + steal; guest time is inside user)."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / TICK


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ---------------------------------------------------------------------------------------
# Baselines: pgbench and q2claim
# ---------------------------------------------------------------------------------------


def pgbench(url: str, clients: int, seconds: int, *, flush: bool = True) -> dict:
    """pgbench's one-row insert; ``flush=False`` runs it with ``synchronous_commit = off``,
    which shows how much of the baseline is the wait for its commit's flush to disk (that
    wait swings on a VM, and the engine's one-at-a-time stream is bound by CPU instead)."""
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
            env={**os.environ, "PGOPTIONS": f"-c synchronous_commit={'on' if flush else 'off'}"},
        )  # fmt: skip
        tps = next(float(line.split("=")[1].split()[0]) for line in out.stdout.splitlines() if line.startswith("tps"))
        latencies = []
        for path in glob.glob(f"{tmp}/log*"):
            for line in Path(path).read_text().splitlines():
                latencies.append(int(line.split()[2]) / 1000.0)
    return {"tps": tps, "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99)}


def q2claim(admin_url: str, count: int, samples: int, directory: Path = Q2CLAIM_DIR) -> dict:
    """Run the q2claim baseline on a database of this run's own and read its JSON lines.

    The steps of its run.sh (migrate, design A, design B), not run.sh itself: run.sh drops
    and recreates the fixed database ``q2claim_baseline`` WITH (FORCE) and leaves it behind,
    which killed any other run on the same server (D106). Its database here is
    ``<BENCH_DB>_q2claim``, created for the baseline and dropped after it.

    Per design: ``jobs_s``, the mean over its repetitions of N ÷ (last finished − first
    created, from its table, minus the time of the one INSERT that creates the N jobs):
    from the jobs becoming visible to the last one finished, like the engine's drain; and
    ``p50`` / ``p99`` (ms) of its latency samples."""
    name = f"{BENCH_DB}_q2claim"
    parts = urlparse(admin_url)
    env = {
        **os.environ,
        "PGHOST": parts.hostname or "127.0.0.1",
        "PGPORT": str(parts.port or 5432),
        "PGUSER": parts.username or "postgres",
        "SPIKE_DB": name,
        "SPIKE_POLL": "0.05",
        "DJANGO_SETTINGS_MODULE": "spike.settings",
    }
    steps = [
        ({}, ["manage.py", "migrate", "-v0"]),
        ({"SPIKE_MODE": "batch", "SPIKE_BULK": "100", "SPIKE_QUEUE_LIMIT": "4", "SPIKE_RECYCLE": "1000000",
          "SPIKE_NOTIFY": "1"}, ["bench.py", "A", "q2-batch100-notify", str(count), str(samples), "2"]),
        ({"SPIKE_B_BATCH": "100", "SPIKE_NOTIFY": "1"},
         ["bench.py", "B", "bare-claim-loop-batch100-notify", str(count), str(samples), "2"]),
    ]  # fmt: skip
    create_database(admin_url, name)
    stdout = ""
    try:
        with tempfile.TemporaryDirectory() as logs:
            for extra, argv in steps:
                out = subprocess.run(
                    [sys.executable, *argv], cwd=directory, env={**env, **extra, "Q2CLAIM_LOGS": logs},
                    capture_output=True, text=True, timeout=1800,
                )  # fmt: skip
                if out.returncode:
                    raise SystemExit(f"q2claim {' '.join(argv)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
                stdout += out.stdout
    finally:
        drop_own_database(admin_url, name)
    return q2claim_figures(stdout)


def q2claim_figures(stdout: str) -> dict:
    """q2claim's JSON lines → per design ``jobs_s``, ``p50``, ``p99``."""
    designs: dict[str, dict] = {}
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        design = designs.setdefault(record["design"], {"rates": []})
        if record["kind"] == "throughput":
            if not record["ok"]:
                raise SystemExit(f"q2claim design {record['design']} did not finish: {line}")
            span = record["db_span_s"] - record["insert_s"]
            design["rates"].append(record["n"] / (span if span > 0 else record["db_span_s"]))
        elif record["kind"] == "latency":
            design.update(p50=record["p50_ms"], p99=record["p99_ms"])
    for name in ("A", "B"):
        if name not in designs or not designs[name]["rates"] or "p50" not in designs[name]:
            raise SystemExit(f"q2claim printed no complete figures for design {name}:\n{stdout}")
        designs[name]["jobs_s"] = statistics.fmean(designs[name]["rates"])
    return designs


# ---------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------


def stop_with_the_benchmark() -> None:
    """In a cluster's process before it starts (``preexec_fn``): SIGTERM when the benchmark
    that started it dies, so a benchmark killed midway leaves no cluster behind, holding
    connections to its database and using the machine's CPU (Linux; elsewhere, nothing)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Cluster:
    """``manage.py obelisk_worker`` in a subprocess."""

    def __init__(self, url: str, workers: int):
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "obelisk_worker", "--workers", str(workers)],
            cwd=ROOT,
            env=child_env(url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=stop_with_the_benchmark,
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()


WORKER_LOG = ROOT / "var" / "bench-run-worker.log"


class Clusters:
    """``count`` clusters of ``workers`` worker processes each (their stderr appended to
    var/bench-run-worker.log), and their /proc figures."""

    def __init__(self, url: str, workers: int, count: int = 1):
        self.workers = workers
        WORKER_LOG.parent.mkdir(exist_ok=True)
        with WORKER_LOG.open("a") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')}: {count} cluster(s) of {workers} worker(s)\n")
            self.processes = [
                subprocess.Popen(
                    [sys.executable, "manage.py", "obelisk_worker", "--workers", str(workers)],
                    cwd=ROOT,
                    env=child_env(url),
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                    preexec_fn=stop_with_the_benchmark,
                )  # fmt: skip
                for _ in range(count)
            ]

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(process_tree(p.pid), p.pid) for p in self.processes)

    def rss_mib(self) -> tuple[float, float]:
        sizes = [rss_mib(process_tree(p.pid)) for p in self.processes]
        return sum(total for total, _ in sizes), max(largest for _, largest in sizes)

    def wait_started(self, timeout: float = 60) -> None:
        """Until every cluster has forked all its processes: the ``obelisk_worker`` process,
        django-q2's sentinel, pusher and monitor, and the workers."""
        deadline = time.monotonic() + timeout
        while any(len(process_tree(p.pid)) < self.workers + 4 for p in self.processes):
            self.check_alive()
            if time.monotonic() > deadline:
                note(f"worker clusters not fully started after {timeout:g} s; measuring anyway")
                return
            time.sleep(0.1)

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise SystemExit(f"a worker cluster exited with status {process.returncode} (see {WORKER_LOG})")

    def stop(self) -> None:
        """SIGTERM to each ``obelisk_worker`` process, once; then any process of their trees
        still there after 30 s (or left behind by a parent that exited) is killed."""
        # (pid, start time): a pid reused by another process meanwhile is not ours to kill
        ours = [(pid, stat[1][19]) for p in self.processes for pid in process_tree(p.pid)[1:] if (stat := _stat(pid))]
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                note(f"a worker cluster did not stop within 30 s: killed (see {WORKER_LOG})")
                process.kill()
                process.wait()
        time.sleep(0.2)
        for pid, started in ours:
            if (stat := _stat(pid)) is not None and stat[1][19] == started and stat[1][0] != "Z":
                note(f"process {pid} of a stopped worker cluster still running: killed (see {WORKER_LOG})")
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def create_pending(count: int) -> list[str]:
    from executions import store
    from executions.ids import ExecutionId
    from workers.components import load_components
    from workers.testing import current_deployment_id

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


_UNFINISHED_SQL = (
    "SELECT EXISTS (SELECT 1 FROM t_state WHERE state = 'pending_at' AND lifecycle = 'active')"
    " OR EXISTS (SELECT 1 FROM t_state WHERE state = 'locked')"
)


def wait_drained(clusters: Clusters, timeout: float = 900, every: float = 0.02) -> None:
    """Until no execution is pending or locked: the no-op activity is in no other state
    before it finishes. The client must weigh little on the machine it measures, so each
    poll reads only the partial indexes of those rows (their states literal text, so that a
    prepared plan can use them, D71). Filtering by function instead scans every finished row:
    by the end of a drain of 20,000 that cost the server 6 ms a poll, about a ninth of the
    machine (docs/benchmarks-history.md)."""
    from django.db import connection

    deadline = time.monotonic() + timeout
    while True:
        with connection.cursor() as cursor:
            cursor.execute(_UNFINISHED_SQL)
            if not cursor.fetchone()[0]:
                return
        if time.monotonic() > deadline:
            raise SystemExit(f"the drain did not finish within {timeout:g} s")
        clusters.check_alive()
        time.sleep(every)


def warm_up(clusters: Clusters, count: int = 50) -> None:
    """Every cluster up and claiming: a few executions drained, then a quiet moment."""
    from django.db import transaction

    clusters.wait_started()
    with transaction.atomic():
        create_pending(count)
    wait_drained(clusters, timeout=120)
    time.sleep(0.5)  # let the lingering workers go back to waiting


def drain_on(clusters: Clusters, count: int) -> dict:
    """Drain ``count`` executions on warm ``clusters``: all created in one transaction, so the
    cluster sees them at once when it commits, as with pending work that piled up."""
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")  # no checkpoint of earlier writes in the middle of the drain
    quiet_from, busy_from = time.perf_counter(), machine_busy_seconds()
    time.sleep(1.0)
    background = (machine_busy_seconds() - busy_from) / (time.perf_counter() - quiet_from)
    with transaction.atomic():
        ids = create_pending(count)
        # Sampled inside the transaction, just before its commit: nothing has been claimed yet.
        machine0, cluster0, started = machine_busy_seconds(), clusters.cpu_seconds(), time.perf_counter()
    wait_drained(clusters)
    machine1, cluster1, wall = machine_busy_seconds(), clusters.cpu_seconds(), time.perf_counter() - started
    rss = clusters.rss_mib()
    seconds = drain_seconds(ids)
    return {
        "exec_s": count / seconds,
        "events_s": 3 * count / seconds,
        "wall_s": wall,
        "cpu_machine_ms": (machine1 - machine0) * 1000 / count,
        "cpu_cluster_ms": (cluster1 - cluster0) * 1000 / count,
        "rss_sum": rss[0],
        "rss_max": rss[1],
        "background_cpus": background,
    }


def drain(url: str, workers: int, count: int, clusters: int = 1) -> dict:
    """Start ``clusters`` clusters of ``workers`` processes, warm them up, drain ``count``
    executions (see ``drain_on``), stop them."""
    running = Clusters(url, workers, clusters)
    try:
        warm_up(running)
        return drain_on(running, count)
    finally:
        running.stop()


def one_at_a_time(count: int) -> dict:
    from executions import store
    from workers.testing import submit

    started = time.perf_counter()
    ids = [submit(FFQN, [])[0] for _ in range(count)]
    submitted = time.perf_counter() - started
    store.wait_for_finished(ids, timeout=600)
    seconds = time.perf_counter() - started
    return {"exec_s": count / seconds, "submit_s": count / submitted}


def latency_samples(count: int) -> list[float]:
    """Submit → result seen by the client, ms, for ``count`` executions back to back."""
    from executions import store
    from workers.testing import submit

    samples = []
    for _ in range(count):
        started = time.perf_counter()
        execution_id, _ = submit(FFQN, [])
        store.wait_for_finished_result(execution_id, timeout=60)
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def latency(count: int) -> dict:
    samples = latency_samples(count)
    return {"p50": percentile(samples, 0.5), "p99": percentile(samples, 0.99), "mean": statistics.fmean(samples)}


def drain_seconds(ids: list[str]) -> float:
    """First ``Locked`` to last ``Finished`` of the executions ``ids``, from their log."""
    from django.db.models import Count, Max, Min

    from executions.models import ExecutionEvent

    events = ExecutionEvent.objects.filter(execution_id__in=ids)
    first_lock = events.filter(variant="locked").aggregate(t=Min("created_at"))["t"]
    finished = events.filter(variant="finished").aggregate(t=Max("created_at"), n=Count("pk"))
    if finished["n"] != len(ids):
        raise SystemExit(f"drain: {finished['n']} of {len(ids)} executions have a finished event")
    return (finished["t"] - first_lock).total_seconds()


def engine(url: str, workers: int, clusters: int, args, serial: bool) -> dict:
    """The drain on ``clusters`` × ``workers``; then, with ``serial``, one at a time and
    latency on the same (single) cluster."""
    running = Clusters(url, workers, clusters)
    try:
        warm_up(running)
        result = {"drain": drain_on(running, args.drain)}
        if serial:
            latency(20)  # warm-up: every process has run one at a time
            result["one_at_a_time"] = one_at_a_time(args.sequential)
            result["latency"] = latency(args.latency)
    finally:
        running.stop()
    return result


# ---------------------------------------------------------------------------------------
# One run: every measure, as a flat dict of figures
# ---------------------------------------------------------------------------------------


def configurations(args) -> list[tuple[str, int, int]]:
    """(label, clusters, workers per cluster) of every drain."""
    configs = [(f"{w} worker{'s' if w > 1 else ''}", 1, w) for w in args.workers_list]
    for spec in args.clusters:
        count, workers = (int(part) for part in spec.lower().split("x"))
        configs.append((f"{count} clusters x {workers} workers", count, workers))
    return configs


def measure_once(args, run: int) -> dict:
    from django.db import connections

    from executions import notify

    notify.stop_listening()
    connections.close_all()
    url = recreate_database(args.database_url)
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=child_env(url), check=True)
    fig: dict = {"load_start": load_average()}
    started = time.monotonic()
    for clients in (1, 2):
        note(f"run {run}: pgbench, {clients} client(s)")
        result = pgbench(url, clients, args.pgbench_seconds)
        fig.update({f"pgbench{clients}_{key}": value for key, value in result.items()})
    note(f"run {run}: pgbench, 1 client, synchronous_commit off")
    fig["pgbench1_noflush_tps"] = pgbench(url, 1, args.pgbench_seconds, flush=False)["tps"]
    designs = {}
    if (args.q2claim / "bench.py").exists():
        note(f"run {run}: q2claim (designs A and B)")
        designs = q2claim(args.database_url, args.baseline_n, args.baseline_latency, args.q2claim)
    else:
        note(f"run {run}: no q2claim baseline at {args.q2claim} (--q2claim, Q2CLAIM_DIR): its columns stay empty")
    for name, design in designs.items():
        fig.update({f"{name}_jobs_s": design["jobs_s"], f"{name}_p50": design["p50"], f"{name}_p99": design["p99"]})
    for label, clusters, workers in configurations(args):
        serial = clusters == 1 and workers in args.serial_workers
        note(f"run {run}: engine, {label}: drain of {args.drain:,}" + (", one at a time, latency" if serial else ""))
        result = engine(url, workers, clusters, args, serial)
        fig.update({f"drain[{label}]_{key}": value for key, value in result["drain"].items()})
        if "A_jobs_s" in fig:
            fig[f"drain[{label}]_vs_A"] = result["drain"]["exec_s"] / fig["A_jobs_s"]
        if serial:
            fig[f"serial[{workers}]_exec_s"] = result["one_at_a_time"]["exec_s"]
            fig[f"serial[{workers}]_vs_pgbench"] = result["one_at_a_time"]["exec_s"] / fig["pgbench1_tps"]
            fig[f"latency[{workers}]_p50"] = result["latency"]["p50"]
            fig[f"latency[{workers}]_p99"] = result["latency"]["p99"]
            if "A_p50" in fig:
                fig[f"latency[{workers}]_vs_A"] = result["latency"]["p50"] / fig["A_p50"]
    fig["load_end"] = load_average()
    fig["seconds"] = time.monotonic() - started
    return fig


# ---------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------


def cell(runs: list[dict], key: str, spec: str) -> str:
    values = [fig[key] for fig in runs if key in fig]
    if not values:
        return ""
    if len(values) == 1:
        return format(values[0], spec)
    return " / ".join(format(v, spec) for v in (min(values), statistics.median(values), max(values)))


def median(runs: list[dict], key: str) -> float | None:
    values = [fig[key] for fig in runs if key in fig]
    return statistics.median(values) if values else None


def holds(value: float | None, test) -> bool | None:
    """A target's verdict; None (no verdict) when its figure is missing."""
    return None if value is None else test(value)


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


def table(runs: list[dict], args) -> list[list[str]]:
    """Rows of cells: measure, unit, engine, baseline, baseline value, ratio, target, verdict."""
    rows = []

    def row(measure, unit, key="", spec=",.0f", baseline="", base_key="", base_spec=",.0f", ratio_key="", target="",
            ok=None):  # fmt: skip
        rows.append([
            measure, unit, cell(runs, key, spec) if key else "", baseline,
            cell(runs, base_key, base_spec) if base_key else "", cell(runs, ratio_key, ".2f") if ratio_key else "",
            target, "" if ok is None else verdict(ok),
        ])  # fmt: skip

    for label, clusters, workers in configurations(args):
        key = f"drain[{label}]"
        two = clusters == 1 and workers == 2  # like design A: one django-q2 cluster of 2 workers
        row(
            f"drain, {label}", "exec/s", f"{key}_exec_s", baseline="design A", base_key="A_jobs_s",
            ratio_key=f"{key}_vs_A", target=f"ratio >= {DRAIN_VS_A:g}" if two else "",
            ok=holds(median(runs, f"{key}_vs_A"), lambda v: v >= DRAIN_VS_A) if two else None,
        )  # fmt: skip
        row("  CPU, whole machine", "ms/exec", f"{key}_cpu_machine_ms", ".3f")
        row("  CPU, worker cluster", "ms/exec", f"{key}_cpu_cluster_ms", ".3f")
        row("  RSS after, all processes", "MiB", f"{key}_rss_sum", ".0f")
        row("  RSS after, largest process", "MiB", f"{key}_rss_max", ".0f")
    for workers in args.serial_workers:
        if workers not in args.workers_list:
            continue
        w = f"{workers} worker{'s' if workers > 1 else ''}"
        row(
            f"one at a time, {w}", "exec/s", f"serial[{workers}]_exec_s", baseline="pgbench, 1 client",
            base_key="pgbench1_tps", ratio_key=f"serial[{workers}]_vs_pgbench", target=f"ratio >= {SERIAL_VS_PGBENCH:g}",
            ok=holds(median(runs, f"serial[{workers}]_vs_pgbench"), lambda v: v >= SERIAL_VS_PGBENCH),
        )  # fmt: skip
        row(
            f"submit -> result p50, {w}", "ms", f"latency[{workers}]_p50", ".2f", "design A p50", "A_p50", ".2f",
            f"latency[{workers}]_vs_A", f"ratio <= {P50_VS_A:g}", holds(median(runs, f"latency[{workers}]_vs_A"), lambda v: v <= P50_VS_A),
        )  # fmt: skip
        row(
            f"submit -> result p99, {w}", "ms", f"latency[{workers}]_p99", ".2f", "design A p99", "A_p99", ".2f",
            target=f"<= {P99_MS:g} ms", ok=holds(median(runs, f"latency[{workers}]_p99"), lambda v: v <= P99_MS),
        )  # fmt: skip
    row("baselines only", "jobs/s", baseline="design B (no django-q2)", base_key="B_jobs_s")
    row("", "ms", baseline="design B p50", base_key="B_p50", base_spec=".2f")
    row("", "ms", baseline="design B p99", base_key="B_p99", base_spec=".2f")
    row("", "tx/s", baseline="pgbench, 2 clients", base_key="pgbench2_tps")
    row("", "tx/s", baseline="pgbench, 1 client, no flush", base_key="pgbench1_noflush_tps")
    row("", "ms", baseline="pgbench, 1 client p50", base_key="pgbench1_p50", base_spec=".2f")
    return rows


def print_table(runs: list[dict], args, host: str) -> None:
    import django.db

    with django.db.connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0].split()[0]
    backgrounds = [v for fig in runs for k, v in fig.items() if k.endswith("_background_cpus")]
    cells = f"min / median / max of {len(runs)} runs" if len(runs) > 1 else "1 run"
    print(
        f"\nObelisk for Django, PostgreSQL {version} at {host}, no-op activity; drain N={args.drain:,}, "
        f"one at a time M={args.sequential:,}, latency K={args.latency:,}; q2claim N={args.baseline_n:,}, "
        f"K={args.baseline_latency:,}; {cells}"
    )
    loads = "; ".join(f"{fig['load_start']} -> {fig['load_end']} ({fig['seconds']:.0f} s)" for fig in runs)
    print(
        f"machine: {os.cpu_count()} CPUs; load average at start -> end of each run: {loads}; "
        f"CPUs busy in the second before each drain (idle cluster + anything else): "
        f"{min(backgrounds):.2f}-{max(backgrounds):.2f}"
    )
    header = ["measure", "unit", "engine", "baseline (same run)", "", "ratio", "target", "verdict"]
    rows = table(runs, args)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    right = {2, 4, 5}

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return " | ".join([f"{parts[0]} {parts[1]}", parts[2], f"{parts[3]} {parts[4]}", *parts[5:]]).rstrip()

    print(line(header))
    print("-" * len(line(header)))
    for r in rows:
        print(line(r))
    legend = (
        "(drain: N pending executions committed at once to a warm cluster, first lock -> last finish in the event "
        "log, 3 events each; CPU per execution: machine = non-idle time of all CPUs (/proc/stat), cluster = "
        "utime+stime of its processes; RSS counts shared pages in each process; one at a time: first submit -> "
        "last result; submit -> result: back to back; design A / B: q2claim, 2 workers / processes, jobs visible "
        "-> last finished, mean of 2 reps; pgbench no flush: synchronous_commit = off; ratio = engine / baseline "
        "of the same run; verdict on the median)"
    )
    print(textwrap.fill(legend, width=len(line(header)), break_on_hyphens=False))


def drop_database(admin_url: str) -> None:
    """Drop this run's ``BENCH_DB`` (only if this process created it)."""
    from django.db import connections

    from executions import notify

    notify.stop_listening()
    connections.close_all()
    drop_own_database(admin_url, BENCH_DB)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--drain", type=int, default=20000, help="executions in each drain")
    parser.add_argument("--sequential", type=int, default=2000, help="executions submitted one at a time")
    parser.add_argument("--latency", type=int, default=500, help="single executions timed end to end")
    parser.add_argument("--workers-list", type=int, nargs="+", default=[1, 2, 4], help="drain with one cluster of N")
    parser.add_argument(
        "--clusters", nargs="*", default=[], metavar="CxW", help="also drain with C clusters of W workers, e.g. 2x2"
    )
    parser.add_argument(
        "--serial-workers", type=int, nargs="*", default=[1, 2], help="worker counts measured one at a time and latency"
    )
    parser.add_argument("--pgbench-seconds", type=int, default=5)
    parser.add_argument("--baseline-n", type=int, default=20000, help="q2claim: jobs per throughput repetition")
    parser.add_argument("--baseline-latency", type=int, default=300, help="q2claim: latency samples")
    parser.add_argument("--runs", type=int, default=1, help="repeat everything; cells show min / median / max")
    parser.add_argument(
        "--q2claim", type=Path, default=Q2CLAIM_DIR, metavar="DIR",
        help="the q2claim baseline's directory (default: ../shared/baselines/q2claim next to this repository)",
    )  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    args = parser.parse_args()

    url = database_url(args.database_url, BENCH_DB)  # created by every run, dropped at the end
    WORKER_LOG.parent.mkdir(exist_ok=True)
    WORKER_LOG.write_text("")
    os.environ.update(child_env(url))
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()

    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so this run's database is dropped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs = []
    try:
        for run in range(1, args.runs + 1):
            runs.append(measure_once(args, run))
        host = urlparse(url)
        print_table(runs, args, f"{host.hostname}:{host.port or 5432}")  # reads the server's version
    finally:
        if args.keep:
            note(f"kept the benchmark database {BENCH_DB}")
        else:
            drop_database(args.database_url)


if __name__ == "__main__":
    main()
