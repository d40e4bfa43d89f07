#!/usr/bin/env python
"""Where one sequential ``ctx.call`` spends its time, on PostgreSQL (issue 40).

Usage: python bench/step_profile.py [--database-url URL] [--n 100] [--strategy await] [--no-profile]

It creates (and drops) a database of its own (``obelisk_step_profile_<checkout>_<pid>``, D106),
starts a worker cluster of one process on it, and runs the sequential workflow of
``bench/workflow_components.py`` (N no-op activity calls in a loop) three times:

1. **counters**: wall time per step (the workflow's ``Created`` → ``Finished``), the CPU of
   each process of the cluster and of each PostgreSQL backend connected to the database
   (``/proc``), and the server's own counters, read before and after: ``pg_stat_database``
   (transactions committed and rolled back, rows inserted / updated / deleted) and
   ``pg_stat_user_tables`` (rows inserted / updated per table). A backend reports its counters
   at most once a second and an idle one within ten, so each read waits 11 s first, and the
   cluster's own idle traffic (its broker's and heartbeat's polls) is measured over an idle
   window of the same kind and subtracted.
2. **statements**: the same run with ``log_min_duration_statement = 0`` set on this database
   alone (new sessions: the cluster is restarted for it), the server's log read back for this
   database's lines: statements per step by kind (``BEGIN``, ``COMMIT``, each ``INSERT``/
   ``UPDATE``/``WITH``/``SELECT`` by its first table) and their server time. psycopg's
   pipeline sends several statements in one round trip, so statements are an upper bound of
   round trips. Needs the log file to be readable (``--server-log``); otherwise skipped.
3. **profiles** (unless ``--no-profile``): the cluster started through this script, which,
   before running ``obelisk_worker``, runs every thread of its processes under a cProfile of
   its own (this script's code, never the engine's) and reads each thread's CPU clock: where
   the worker's time goes, per step, waits included (cProfile's clock is the wall's), and
   which thread uses the CPU.

Before them all, the timeline of one one-step workflow (``client.submit`` → ``client.wait``)
comes from the server's log too (phase 2).

The engine's code is not changed or hooked: the counters are the server's and the kernel's;
the profilers live in this benchmark's launcher.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import cProfile
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SAMPLE_DIR_VARIABLE = "OBELISK_STEP_PROFILE_SAMPLES"
CLOCK_VARIABLE = "OBELISK_STEP_PROFILE_CLOCK"
# cProfile's clock in the cluster: each thread's CPU (where the CPU goes; every call dearer
# to time) or the wall's (where the time goes, waits included).
CLOCK = time.thread_time if os.environ.get(CLOCK_VARIABLE, "cpu") == "cpu" else time.perf_counter
IDLE_WAIT = 11.0  # seconds: an idle backend reports its counters within 10 s (PostgreSQL 15)


# ---------------------------------------------------------------------------------------
# The profilers, in the cluster's processes (started by ``--serve``)
# ---------------------------------------------------------------------------------------


def label(code) -> str:
    """``path:function`` of a code object, the path relative to the checkout or to
    site-packages; a builtin's name as cProfile gives it."""
    if isinstance(code, str):
        return code
    path = code.co_filename
    for prefix in (str(ROOT) + "/", "/site-packages/", "/lib/python3"):
        if prefix in path:
            path = path.split(prefix, 1)[1]
    return f"{path}:{code.co_name}"


class Profiles(threading.Thread):
    """A cProfile per thread of this process (wall time, the profiler's default clock: a
    function's time includes its waits, so a round trip shows as time in psycopg's ``wait``)
    and each thread's CPU (its own clock, ns). Dumped to ``<dir>/samples-<pid>.json`` twice a
    second, cumulative: the reader subtracts two dumps."""

    def __init__(self, directory: Path):
        super().__init__(daemon=True, name="step-profile-dump")
        self.unprofiled = True
        self.path = directory / f"samples-{os.getpid()}.json"
        self.profilers: list[tuple[str, cProfile.Profile]] = []
        self.cpu_by_thread: collections.Counter = collections.Counter()
        self.last: dict[int, int] = {}
        self.lock = threading.Lock()

    def add(self, name: str, profiler: cProfile.Profile) -> None:
        with self.lock:
            self.profilers.append((re.sub(r"_[0-9A-Z]{20,}", "_…", name), profiler))

    def thread_cpu(self) -> None:
        for thread in threading.enumerate():
            try:
                now = time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))
            except (OSError, OverflowError, TypeError):
                continue
            used, self.last[thread.ident] = now - self.last.get(thread.ident, now), now
            self.cpu_by_thread[re.sub(r"_[0-9A-Z]{20,}", "_…", thread.name)] += max(used, 0)

    def document(self) -> dict:
        functions: dict[str, list] = {}
        with self.lock:
            profilers = list(self.profilers)
        for _, profiler in profilers:
            for entry in profiler.getstats():
                row = functions.setdefault(label(entry.code), [0, 0.0, 0.0])
                row[0] += entry.callcount
                row[1] += entry.inlinetime
                row[2] += entry.totaltime
        return {"functions": functions, "threads": self.cpu_by_thread}

    def run(self) -> None:
        """Dumps when ``<dir>/dump`` changes (reading every profile costs milliseconds: done
        twice a second it was a third of the process's CPU), and keeps the threads' CPU."""
        request = self.path.parent / "dump"
        served = None
        while True:
            time.sleep(0.1)
            self.thread_cpu()
            try:
                asked = request.read_text()
            except OSError:
                continue
            if asked != served:
                served = asked
                self.path.with_suffix(".tmp").write_text(json.dumps({"request": asked, **self.document()}))
                self.path.with_suffix(".tmp").replace(self.path)


_profiles: Profiles | None = None


def profile_threads(directory: Path) -> None:
    """Every thread started from now on runs under a cProfile of its own; the main thread
    of each process from its first database connection on (the cluster's processes are
    forked from this one, after this)."""
    from django.db.backends.signals import connection_created

    original = threading.Thread.run

    def run(thread) -> None:
        if getattr(thread, "unprofiled", False) or _profiles is None:
            return original(thread)
        profiler = cProfile.Profile(CLOCK)
        _profiles.add(thread.name, profiler)
        profiler.enable()
        try:
            return original(thread)
        finally:
            profiler.disable()

    threading.Thread.run = run
    started: set[int] = set()

    def start(**_) -> None:
        global _profiles
        if os.getpid() in started:
            return
        started.add(os.getpid())
        _profiles = Profiles(directory)
        _profiles.start()
        if threading.current_thread() is threading.main_thread():
            profiler = cProfile.Profile(CLOCK)
            _profiles.add("MainThread", profiler)
            profiler.enable()

    connection_created.connect(start, weak=False)


def serve(workers: int) -> None:
    """``manage.py obelisk_worker``, with its threads profiled when asked."""
    import django

    django.setup()
    from django.core.management import call_command

    if directory := os.environ.get(SAMPLE_DIR_VARIABLE):
        profile_threads(Path(directory))
    call_command("obelisk_worker", workers=workers)


# ---------------------------------------------------------------------------------------
# Counters: /proc and the server's statistics
# ---------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:60].strip()
    except OSError:
        return "?"


class ServerCounters:
    """This database's counters and its backends' CPU, from a connection of our own."""

    def __init__(self, url: str, name: str):
        import psycopg

        self.name = name
        self.conn = psycopg.connect(url, autocommit=True)
        self.own_pid = self.conn.info.backend_pid

    def read(self) -> dict:
        database = self.conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, tup_fetched "
            "FROM pg_stat_database WHERE datname = %s",
            [self.name],
        ).fetchone()
        tables = self.conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del FROM pg_stat_user_tables"
        ).fetchall()
        backends = self.conn.execute(
            "SELECT pid, coalesce(application_name, '') FROM pg_stat_activity WHERE datname = %s AND pid <> %s",
            [self.name, self.own_pid],
        ).fetchall()
        keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted", "tup_fetched")
        return {
            "at": time.monotonic(),
            "database": dict(zip(keys, database, strict=True)),
            "tables": {row[0]: {"ins": row[1], "upd": row[2], "hot": row[3], "del": row[4]} for row in tables},
            "backends": {pid: proc_cpu(pid) for pid, _ in backends},
            "reads": 3,  # this connection's own transactions (one per statement)
        }


def delta(before: dict, after: dict) -> dict:
    database = {k: after["database"][k] - before["database"][k] for k in after["database"]}
    database["xact_commit"] -= before["reads"]
    tables = {}
    for name, row in after["tables"].items():
        old = before["tables"].get(name, {k: 0 for k in row})
        tables[name] = {k: row[k] - old[k] for k in row}
    backend_cpu = sum(
        cpu - (before["backends"].get(pid) or 0.0) for pid, cpu in after["backends"].items() if cpu is not None
    )
    return {"seconds": after["at"] - before["at"], "database": database, "tables": tables, "backend_cpu": backend_cpu}


def net(run: dict, idle: dict) -> dict:
    """The run's counters minus the cluster's idle traffic over as long a time."""
    scale = run["seconds"] / idle["seconds"]
    database = {k: v - idle["database"][k] * scale for k, v in run["database"].items()}
    tables = {
        name: {k: v - idle["tables"].get(name, {}).get(k, 0) * scale for k, v in row.items()}
        for name, row in run["tables"].items()
    }
    return {
        **run,
        "database": database,
        "tables": tables,
        "backend_cpu": run["backend_cpu"] - idle["backend_cpu"] * scale,
    }


# ---------------------------------------------------------------------------------------
# The cluster and the runs
# ---------------------------------------------------------------------------------------


class ProfiledCluster:
    """One worker process (plus django-q2's sentinel, broker and monitor), started through
    ``--serve`` so that profilers can ride along."""

    def __init__(self, url: str, env_extra: dict, sample_dir: Path | None):
        from bench.run import child_env, stop_with_the_benchmark
        from bench.workflows import EXTRA_ENV

        env = {**child_env(url), **EXTRA_ENV, **env_extra}
        if sample_dir:
            env[SAMPLE_DIR_VARIABLE] = str(sample_dir)
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(ROOT / "var" / "bench-step-profile-worker.log", "w"),  # noqa: SIM115
            preexec_fn=stop_with_the_benchmark,
        )

    def pids(self) -> list[int]:
        from bench.run import process_tree

        return process_tree(self.process.pid)

    def cpu(self) -> dict[int, float]:
        return {pid: cpu for pid in self.pids() if (cpu := proc_cpu(pid)) is not None}

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def run_once(ffqn: str, n: int) -> tuple[float, int]:
    """The workflow's Created → Finished (s) and its event count."""
    from bench.workflows import Meter, run_workflow

    run = run_workflow(ffqn, n, Meter(os.getpid(), None), timeout=300)
    if run is None:
        raise SystemExit(f"{ffqn}({n}) did not finish in 300 s")
    return run.seconds, run.events


def counters_phase(url: str, name: str, ffqn: str, n: int, note) -> dict:
    cluster = ProfiledCluster(url, {}, None)
    try:
        run_once(ffqn, 5)  # warm-up: the pool's thread, prepared statements
        run_once(ffqn, n)
        server = ServerCounters(url, name)
        time.sleep(IDLE_WAIT)
        s0 = server.read()
        note(f"counters: idle window of {IDLE_WAIT:g} s")
        time.sleep(IDLE_WAIT)
        s1 = server.read()
        cpu1 = cluster.cpu()
        note(f"counters: the sequential workflow, N={n}")
        clock = time.monotonic()
        seconds, events = run_once(ffqn, n)
        client_seconds = time.monotonic() - clock
        cpu2 = cluster.cpu()
        time.sleep(IDLE_WAIT)
        s2 = server.read()
        idle = delta(s0, s1)
        run = delta(s1, s2)
        idle_cpu_rate = 0.0  # the cluster's own CPU while idle is measured apart: a few ms/s
        processes = {pid: cpu2[pid] - cpu1.get(pid, 0.0) for pid in cpu2}
        return {
            "n": n,
            "seconds": seconds,
            "client_seconds": client_seconds,
            "events": events,
            "run": run,
            "idle": idle,
            "net": net(run, idle),
            "processes": {f"{pid} {proc_name(pid)}": cpu for pid, cpu in processes.items()},
            "worker_cpu": sum(processes.values()) - idle_cpu_rate,
        }
    finally:
        cluster.stop()


LOG_START = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+) \S+ \[(\d+)\] (\S*)@(\S*) (\w+):  (.*)$")
LOG_STATEMENT = re.compile(r"^duration: ([\d.]+) ms  (?:statement|execute [^:]*): (.*)$", re.S)


@dataclass
class Logged:
    at: float  # epoch seconds, when the statement ended (the server logs it then)
    pid: str
    ms: float
    sql: str

    @property
    def kind(self) -> str:
        return statement_kind(self.sql)


def parse_log(text: str, database: str) -> list[Logged]:
    """This database's statements from the server's log (``%m [%p] %q%u@%d``, Debian's
    prefix), a statement's later lines joined to its first."""
    records: list[Logged] = []
    current = None
    for line in text.splitlines():
        start = LOG_START.match(line)
        if start is None:
            if current is not None:
                current[1] += "\n" + line
            continue
        if current is not None:
            records.extend(_statement(*current))
        stamp, pid, _, db, level, rest = start.groups()
        current = [(stamp, pid, db, level), rest] if db == database and level == "LOG" else None
    if current is not None:
        records.extend(_statement(*current))
    return records


def _statement(head: tuple, rest: str) -> list[Logged]:
    stamp, pid, _, _ = head
    match = LOG_STATEMENT.match(rest)
    if match is None:
        return []
    at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
    return [Logged(at, pid, float(match.group(1)), match.group(2))]


def statement_kind(sql: str) -> str:
    """``BEGIN``, ``COMMIT``, or the first keyword and the table it is about: a one-statement
    write (a ``WITH``: D69, D70, D81) by the tables it inserts into and updates."""
    text = " ".join(sql.split())
    first = text.split(" ", 1)[0].upper() if text else "?"
    if first in {"BEGIN", "COMMIT", "ROLLBACK", "LISTEN", "UNLISTEN", "SAVEPOINT", "RELEASE"}:
        return first
    tables = re.findall(r'\b"?(t_[a-z_]+|django_q_[a-z_]+|obelisk_[a-z_]+|deployments_[a-z_]+)"?', text)
    main = tables[0] if tables else ""
    if first in {"WITH", "SELECT"}:
        modified = re.findall(r'(INSERT INTO|UPDATE) "?([a-z_]+)', text)
        if modified:
            main = "+".join(dict.fromkeys(f"{verb.split()[0].lower()} {table}" for verb, table in modified))
    if "pg_notify" in text:
        main += " +pg_notify"
    return f"{first} {main}".strip()


def logged_during(server_log: Path, name: str, action) -> list[Logged]:
    """What this database's sessions ran while ``action()`` ran, from the server's log."""
    offset = server_log.stat().st_size
    action()
    time.sleep(0.5)  # the last lines written
    with server_log.open("rb") as log:
        log.seek(offset)
        return parse_log(log.read().decode(errors="replace"), name)


def statements_phase(url: str, name: str, ffqn: str, n: int, server_log: Path, note) -> dict | None:
    """Every statement of the sequential run, and a timeline of one one-step workflow."""
    import psycopg

    from executions import client

    if not os.access(server_log, os.R_OK):
        note(f"statements: the server's log {server_log} is not readable here: skipped")
        return None
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {name} SET log_min_duration_statement = 0")
    from django.db import connections

    from executions import notify

    notify.stop_listening()  # this process's sessions too: the setting applies to new ones
    connections.close_all()
    cluster = ProfiledCluster(url, {}, None)
    moments: dict[str, float] = {}

    def one_step() -> None:
        moments["submit"] = time.time()
        execution_id = client.submit(ffqn, [1]).execution_id
        moments["submitted"] = time.time()
        client.wait(execution_id, timeout=60, release_connection=False)
        moments["result"] = time.time()

    try:
        run_once(ffqn, 5)
        run_once(ffqn, n)  # warm: statements prepared (D71) as in the measured run
        for _ in range(5):
            one_step()
        note(f"statements: the sequential workflow, N={n}, every statement logged")
        sequential = logged_during(server_log, name, lambda: run_once(ffqn, n))
        note("statements: one one-step workflow, submit -> result, every statement logged")
        single = logged_during(server_log, name, one_step)
    finally:
        cluster.stop()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER DATABASE {name} RESET log_min_duration_statement")
    kinds: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for record in sequential:
        kinds[record.kind][0] += 1
        kinds[record.kind][1] += record.ms
    middle = len(sequential) // 2
    return {
        "n": n,
        "kinds": dict(kinds),
        "backends": len({r.pid for r in sequential}),
        "window": sequential[middle : middle + 40],
        "one_step": [r for r in single if moments["submit"] - 0.001 <= r.at <= moments["result"] + 0.001],
        "moments": moments,
    }


def profiles_phase(url: str, ffqn: str, n: int, directory: Path, clock: str, note) -> dict:
    """The cluster's threads under cProfile: functions (calls, own and inclusive wall time)
    and each thread's CPU, over one sequential run."""
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("samples-*.json"):
        old.unlink()
    cluster = ProfiledCluster(url, {CLOCK_VARIABLE: clock}, directory)

    def read(request: str) -> dict:
        """Every process's dump for ``request``."""
        (directory / "dump").write_text(request)
        deadline = time.monotonic() + 10
        found: dict = {}
        while time.monotonic() < deadline:
            time.sleep(0.2)
            for path in directory.glob("samples-*.json"):
                try:
                    document = json.loads(path.read_text())
                except (OSError, json.JSONDecodeError):
                    continue
                if document["request"] == request:
                    found[path.name] = document
            if found and len(found) == len(list(directory.glob("samples-*.json"))):
                break
        return found

    try:
        run_once(ffqn, 5)
        run_once(ffqn, n)
        before = read("before")
        note(f"profiles: the sequential workflow, N={n}, every thread of the cluster under cProfile")
        seconds, _ = run_once(ffqn, n)
        after = read("after")
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
    functions: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    threads: collections.Counter = collections.Counter()
    for file, document in after.items():
        old = before.get(file, {"functions": {}, "threads": {}})
        for key, row in document["functions"].items():
            was = old["functions"].get(key, [0, 0.0, 0.0])
            for i in range(3):
                functions[key][i] += row[i] - was[i]
        for key, ns in document["threads"].items():
            threads[key] += ns - old["threads"].get(key, 0)
    return {"functions": dict(functions), "threads": threads, "seconds": seconds, "clock": clock}


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------


def report(counters: dict, statements: dict | None, profiles: dict | None, top: int) -> None:
    n = counters["n"]
    run, clean = counters["run"], counters["net"]
    print(f"\nOne sequential ctx.call of a no-op activity, N={n}, one worker process (figures per step)\n")
    print(
        f"wall: {counters['seconds'] * 1000 / n:.2f} ms/step (Created -> Finished; "
        f"{counters['client_seconds'] * 1000 / n:.2f} ms/step as the client saw it, submit to result read back)"
    )
    print(f"events in the workflow's log: {counters['events']} ({counters['events'] / n:.2f}/step)")
    print(f"worker cluster CPU: {counters['worker_cpu'] * 1000 / n:.2f} ms/step, by process:")
    for process, cpu in sorted(counters["processes"].items(), key=lambda item: -item[1]):
        if cpu > 0:
            print(f"    {cpu * 1000 / n:7.3f} ms/step  {process}")
    print(
        f"PostgreSQL backends of this database: {run['backend_cpu'] * 1000 / n:.2f} ms/step CPU "
        f"({clean['backend_cpu'] * 1000 / n:.2f} without the idle traffic)"
    )
    print("\nserver counters (pg_stat_database), per step: raw / without the cluster's idle traffic")
    for key, value in run["database"].items():
        print(f"    {key:<14} {value / n:8.2f} / {clean['database'][key] / n:8.2f}")
    print("rows per table (pg_stat_user_tables), per step, without the idle traffic: inserted / updated (HOT)")
    for table, row in sorted(clean["tables"].items()):
        if abs(row["ins"]) / n >= 0.01 or abs(row["upd"]) / n >= 0.01:
            print(f"    {table:<32} {row['ins'] / n:6.2f} / {row['upd'] / n:6.2f} ({row['hot'] / n:.2f})")
    print(
        f"(idle traffic: {counters['idle']['database']['xact_commit'] / counters['idle']['seconds']:.1f} "
        "transactions/s, the broker's and the heartbeat's polls)"
    )
    if statements:
        total = sum(count for count, _ in statements["kinds"].values())
        server_ms = sum(ms for _, ms in statements["kinds"].values())
        print(
            f"\nstatements (server log, log_min_duration_statement = 0), per step: {total / n:.2f} statements, "
            f"{server_ms / n:.3f} ms of server time in them (a COMMIT's includes its flush), "
            f"over {statements['backends']} backends; count x mean ms, kind"
        )
        for kind, (count, ms) in sorted(statements["kinds"].items(), key=lambda item: -item[1][0]):
            if count / n >= 0.005:
                print(f"    {count / n:6.2f} x {ms / max(count, 1):7.3f} ms  {kind[:120]}")
        window = statements["window"]
        if window:
            print("\ntimeline of a few steps in the middle of the run (ms from the first line; logged at each end)")
            timeline(window, window[0].at)
        moments = statements["moments"]
        if statements["one_step"]:
            print(
                "\none one-step workflow, client.submit -> client.wait: "
                f"{(moments['result'] - moments['submit']) * 1000:.1f} ms as the client saw it "
                f"(submit returned at {(moments['submitted'] - moments['submit']) * 1000:.1f} ms); "
                "its statements (ms from the submit; logged at each end)"
            )
            timeline(statements["one_step"], moments["submit"])
    if profiles:
        seconds = profiles["seconds"]
        cpu = sum(profiles["threads"].values()) / 1e6
        clock = "CPU" if profiles["clock"] == "cpu" else "wall time, waits included"
        print(
            f"\nworker threads under cProfile, clock: {clock} (every function call timed: slower; the run took "
            f"{seconds * 1000 / n:.2f} ms/step): CPU by thread (its own clock), {cpu / n:.2f} ms/step in all"
        )
        for name, ns in profiles["threads"].most_common(8):
            if ns > 0:
                print(f"    {ns / 1e6 / n:7.3f} ms/step  {name}")
        rows = sorted(profiles["functions"].items(), key=lambda item: -item[1][1])
        print(f"\nfunctions by own time ({clock}), top {top}: calls/step, ms/step own, ms/step inclusive")
        for key, (calls, own, inclusive) in rows[:top]:
            print(f"    {calls / n:7.2f} {own * 1000 / n:8.3f} {inclusive * 1000 / n:8.3f}  {key}")
        rows = sorted(
            ((k, v) for k, v in profiles["functions"].items() if "/" in k and not k.startswith(("threading", "3."))),
            key=lambda item: -item[1][2],
        )
        print(f"\nfunctions by inclusive time ({clock}), top {top}: calls/step, ms/step own, ms/step inclusive")
        for key, (calls, own, inclusive) in rows[:top]:
            print(f"    {calls / n:7.2f} {own * 1000 / n:8.3f} {inclusive * 1000 / n:8.3f}  {key}")


def timeline(records: list, origin: float) -> None:
    backends: dict[str, str] = {}
    for record in records:
        backend = backends.setdefault(record.pid, f"backend {len(backends) + 1}")
        print(f"    {(record.at - origin) * 1000:8.2f}  {backend:<10} {record.ms:7.3f} ms  {record.kind[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--n", type=int, default=100, help="calls of the sequential workflow")
    parser.add_argument("--strategy", default="await", choices=["await", "interrupt"])
    parser.add_argument("--server-log", type=Path, default=Path("/var/log/postgresql/postgresql-15-main.log"))
    parser.add_argument("--no-statements", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--clock", default="cpu", choices=["cpu", "wall"],
        help="cProfile's clock in the cluster: each thread's CPU, or the wall's (waits included)",
    )  # fmt: skip
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if args.serve:
        serve(1)
        return

    import bench.run
    from bench.workflows import EXTRA_ENV, SEQUENTIAL

    bench.run.BENCH_DB = name = bench.run.own_database_name("obelisk_step_profile")
    atexit.register(bench.run.drop_own_database, args.database_url, name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = bench.run.recreate_database(args.database_url)
    env = {**bench.run.child_env(url), **EXTRA_ENV}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    import django

    django.setup()
    ffqn = SEQUENTIAL[args.strategy]
    counters = counters_phase(url, name, ffqn, args.n, bench.run.note)
    statements = (
        None if args.no_statements else statements_phase(url, name, ffqn, args.n, args.server_log, bench.run.note)
    )
    profiles = (
        None
        if args.no_profile
        else profiles_phase(
            url,
            ffqn,
            args.n,
            Path(os.environ.get("TMPDIR") or "/tmp") / f"step-profile-{os.getpid()}",
            args.clock,
            bench.run.note,
        )
    )
    print(f"load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}; strategy {args.strategy}")
    report(counters, statements, profiles, args.top)
    from django.db import connections

    from executions import notify

    notify.stop_listening()
    connections.close_all()


if __name__ == "__main__":
    main()
