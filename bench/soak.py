#!/usr/bin/env python
"""Soak test: a mixed workload on three worker clusters while workers and the database fail.

Usage: python bench/soak.py [--minutes 3]

Not part of the test suite: it asserts nothing and prints a report of the engine's
guarantees under faults, so a person can read what held and what did not.

1. Starts its own throwaway PostgreSQL (``initdb`` in a temporary directory, a random
   port) so it can restart it, and migrates a fresh database.
2. Starts three worker clusters (``manage.py obelisk_worker --workers 2``), each its own
   process group, with the activities of ``bench/soak_activities.py``.
3. Submits a mixed workload for ``--minutes``: no-ops, slow activities (1-3 s), long ones
   (8-10 s, past the shutdown grace), activities that fail their first attempts then
   succeed, activities that always fail, activities that exceed their timeout, and slow
   ones the driver cancels while they run. Every activity notes each start in a file, so
   runs that happened twice can be counted.
4. Meanwhile, spaced out: ``kill -9`` of one cluster's process group, SIGTERM of another
   cluster's main process, and a PostgreSQL restart; a replacement cluster follows each
   cluster loss.
5. Waits for every execution to finish (up to ``--wait-limit``), then prints the report.
6. Stops every cluster and the throwaway PostgreSQL (cluster logs are kept; the report
   says where).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "obelisk_soak"
READY_LINE = "broker serving"  # logged by workers.broker once the pusher is dequeuing
SHUTDOWN_GRACE_SECONDS = 5
LONG_SECONDS = (8.0, 10.0)  # the `long` activities outlast the shutdown grace
DB_RETRY_LIMIT = 120  # seconds a driver operation keeps retrying through an outage


# ---------------------------------------------------------------------------------------
# The throwaway PostgreSQL
# ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThrowawayPostgres:
    """A PostgreSQL cluster of our own (as ``scripts/lib.sh`` ``start_throwaway_pg``): the
    soak restarts it, which it must never do to a server others use."""

    def __init__(self):
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
        if not bins or not (bins[-1] / "initdb").exists():
            sys.exit("PostgreSQL server binaries (initdb, pg_ctl) not found under /usr/lib/postgresql")
        self.bin = bins[-1]
        self.dir = Path(tempfile.mkdtemp(prefix="obelisk-soak-pg."))
        self.port = free_port()
        self.as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_postgres:
            shutil.chown(self.dir, "postgres")

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        subprocess.run([*self.as_postgres, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), *args],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip

    def start(self) -> None:
        with open(self.dir / "initdb.log", "w") as log:
            subprocess.run([*self.as_postgres, str(self.bin / "initdb"), "-D", str(self.dir / "data"),
                            "-A", "trust", "-U", "postgres", "--no-sync"], check=True, stdout=log, stderr=log)  # fmt: skip
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=300"
        self._pg_ctl("-l", str(self.dir / "server.log"), "-w", "-t", "60", "-o", options, "start")

    def restart(self) -> None:
        """``pg_ctl restart -m fast``: every connection is cut, work in flight is lost."""
        self._pg_ctl("-w", "-t", "60", "-m", "fast", "restart")

    def stop(self) -> None:
        try:
            self._pg_ctl("-w", "-t", "60", "-m", "fast", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def create_database(self) -> str:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"


# ---------------------------------------------------------------------------------------
# Worker clusters
# ---------------------------------------------------------------------------------------


def child_env(url: str) -> dict:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
        OBELISK_COMPONENT_MODULES="bench.soak_activities",
        OBELISK_SHUTDOWN_GRACE_SECONDS=str(SHUTDOWN_GRACE_SECONDS),
        OBELISK_LOG_LEVEL="INFO",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    return env


@dataclass
class Cluster:
    """``manage.py obelisk_worker --workers 2`` in its own session, so its whole process
    tree (sentinel, pusher, monitor, workers share the group) can be killed at once."""

    name: str
    url: str
    log_path: Path
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_seconds: float | None = None  # from start to the broker serving
    fate: str = "ran to the end"

    def start(self) -> Cluster:
        self.started_at = time.time()
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "obelisk_worker", "--workers", "2"],
                cwd=ROOT, env=child_env(self.url), stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_ready(self, timeout: float = 120) -> bool:
        deadline = time.monotonic() + timeout
        while READY_LINE not in self.log():
            if self.process.poll() is not None or time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        self.ready_seconds = time.time() - self.started_at
        return True

    def group_alive(self) -> bool:
        try:
            os.killpg(self.pid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def kill_group(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.poll() is None:
            self.process.wait(10)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL to whatever is left of the group."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill_group()

    def log_summary(self) -> dict:
        """What its log says about its health: tracebacks, outage lines, and its ERROR
        lines grouped by message (count, last time seen)."""
        lines = self.log().splitlines()
        errors: dict[str, list] = {}
        for line in lines:
            for level in (" ERROR ", " CRITICAL "):
                if level in line:
                    message = line.split(level, 1)[1]
                    entry = errors.setdefault(message[:120], [0, ""])
                    entry[0] += 1
                    entry[1] = line[11:23]  # HH:MM:SS,mmm
        return {
            "tracebacks": sum(line.count("Traceback") for line in lines),
            "unavailable": sum(1 for line in lines if "database unavailable" in line),
            "available_again": sum(1 for line in lines if "database available again" in line),
            "errors": errors,
        }


class Fleet:
    """The clusters ever started; the fault thread replaces them while the driver runs."""

    def __init__(self, url: str, log_dir: Path):
        self.url = url
        self.log_dir = log_dir
        self.all: list[Cluster] = []
        self.lock = threading.Lock()

    def start_one(self) -> Cluster:
        with self.lock:
            name = f"c{len(self.all) + 1}"
            cluster = Cluster(name, self.url, self.log_dir / f"{name}.log").start()
            self.all.append(cluster)
        return cluster

    def running(self) -> list[Cluster]:
        with self.lock:
            return [c for c in self.all if c.process.poll() is None]

    def stop_all(self) -> None:
        for cluster in self.all:
            cluster.stop()


# ---------------------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------------------


@dataclass
class Fault:
    what: str
    at: float  # when it was injected (time.time())
    completed_at: float | None = None  # PG restart: the server is back; SIGTERM: the cluster exited
    cluster: str | None = None
    cluster_pgid: int | None = None
    note: str = ""


class VictimChooser:
    """Picks the cluster a fault hits: one that is running an activity of a given kind
    right now (started so recently that it is surely still running), so the fault lands
    on work in flight rather than on idle workers. Reads the start records itself (the
    driver's reader belongs to the driver's thread)."""

    def __init__(self, fleet: Fleet, starts_dir: Path, kind_of: dict):
        self.fleet = fleet
        self.reader = StartsLog(starts_dir)
        self.kind_of = kind_of  # execution id -> Submitted, filled by the driver

    def choose(self, kind: str, within: float, wait: float = 30) -> tuple[Cluster, str]:
        deadline = time.monotonic() + wait
        recent: list[tuple[str, Start]] = []
        while True:
            now = time.time()
            recent = [(i, s) for i, s in recent + self.reader.poll() if now - s.at < within]
            ready = {c.pid: c for c in self.fleet.running() if c.ready_seconds is not None}
            for execution_id, start in recent:
                submitted = self.kind_of.get(execution_id)
                if submitted is not None and submitted.kind == kind and start.pgid in ready:
                    return ready[start.pgid], f"chosen while running a `{kind}` activity ({execution_id})"
            if time.monotonic() >= deadline:
                return next(iter(ready.values())), f"no `{kind}` activity seen running within {wait:g} s"
            time.sleep(0.1)


def kill_nine(fleet: Fleet, chooser: VictimChooser, faults: list[Fault]) -> None:
    """A host dying: every process of one cluster at once, nothing handed back."""
    victim, why = chooser.choose("slow", within=0.8)
    fault = Fault("kill -9 of a cluster's process group", time.time(), cluster=victim.name, cluster_pgid=victim.pid)
    victim.kill_group()
    victim.fate = "killed (kill -9 of its process group)"
    fault.completed_at = time.time()
    faults.append(fault)
    replacement = fleet.start_one()
    fault.note = f"{why}; replacement {replacement.name} " + (
        f"ready after {replacement.ready_seconds:.1f} s" if replacement.wait_ready() else "NOT ready"
    )


def sigterm(fleet: Fleet, chooser: VictimChooser, faults: list[Fault]) -> None:
    """An orderly stop (a deploy): SIGTERM to the main process only; it must hand back
    what it has not started, let running work finish within the grace, then exit. The
    victim runs a long activity that outlasts the grace, so it must be handed back too."""
    victim, why = chooser.choose("long", within=LONG_SECONDS[0] - SHUTDOWN_GRACE_SECONDS - 1)
    fault = Fault("SIGTERM of a cluster's main process", time.time(), cluster=victim.name, cluster_pgid=victim.pid)
    faults.append(fault)
    victim.process.send_signal(signal.SIGTERM)
    limit = SHUTDOWN_GRACE_SECONDS + 60
    try:
        victim.process.wait(limit)
        fault.completed_at = time.time()
        exited = f"main process exited {fault.completed_at - fault.at:.1f} s after SIGTERM (code {victim.process.returncode})"
    except subprocess.TimeoutExpired:
        exited = f"main process still running {limit} s after SIGTERM: killed"
    time.sleep(1)
    stragglers = victim.group_alive()
    victim.kill_group()
    victim.fate = "stopped by SIGTERM" + ("; stragglers in its group were killed" if stragglers else "")
    replacement = fleet.start_one()
    ready = replacement.wait_ready()
    fault.note = f"{why}; {exited}; {'stragglers left in its process group' if stragglers else 'no stragglers'}; " + (
        f"replacement {replacement.name} ready after {replacement.ready_seconds:.1f} s"
        if ready
        else "replacement NOT ready"
    )


def pg_restart(pg: ThrowawayPostgres, faults: list[Fault]) -> None:
    """The database goes away under load and comes back: every connection is cut."""
    fault = Fault("PostgreSQL restart (pg_ctl restart -m fast)", time.time())
    faults.append(fault)
    try:
        pg.restart()
        fault.completed_at = time.time()
        fault.note = f"server back after {fault.completed_at - fault.at:.1f} s"
    except subprocess.CalledProcessError as error:
        fault.note = f"pg_ctl restart failed: {error}"


def run_faults(plan: list[tuple[float, Callable[[], None]]], stop: threading.Event, errors: list[str]) -> None:
    """The fault thread: each fault at its offset from the start, one after another."""
    started = time.monotonic()
    for offset, action in plan:
        if stop.wait(max(0.0, offset - (time.monotonic() - started))):
            return
        try:
            action()
        except Exception as error:  # noqa: BLE001 - reported, the soak goes on
            errors.append(f"{action}: {type(error).__name__}: {error}")


# ---------------------------------------------------------------------------------------
# The driver's database calls survive the outage it causes
# ---------------------------------------------------------------------------------------


def with_db_retry(operation, *, limit: float = DB_RETRY_LIMIT):
    """Run ``operation`` until it gets through: the driver shares the database outage it
    injects, and the submissions it retries are idempotent (the execution id is fixed)."""
    from django.db import Error, connection

    deadline = time.monotonic() + limit
    delay = 0.05
    while True:
        try:
            return operation()
        except Error:
            if time.monotonic() >= deadline:
                raise
            try:
                connection.close()
            except Error:
                pass
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


# ---------------------------------------------------------------------------------------
# The workload
# ---------------------------------------------------------------------------------------

# kind: (function, weight)
KINDS = {
    "noop": ("soak:acts/quick.noop", 60),
    "slow": ("soak:acts/slow.sleep", 8),
    "long": ("soak:acts/slow.long", 1),
    "flaky": ("soak:acts/flaky.fail-first", 10),
    "always_fails": ("soak:acts/failing.always", 6),
    "timeout": ("soak:acts/overrun.sleep", 3),
    "cancel": ("soak:acts/cancel.target", 3),
}


def arguments(kind: str, starts_dir: str, rng: random.Random) -> list:
    if kind == "noop":
        return [starts_dir]
    if kind == "slow":
        return [starts_dir, round(rng.uniform(1.0, 3.0), 2)]
    if kind == "long":
        return [starts_dir, round(rng.uniform(*LONG_SECONDS), 2)]
    if kind == "flaky":
        return [starts_dir, rng.randint(1, 2)]
    if kind == "always_fails":
        return [starts_dir, rng.random() < 0.5]
    if kind == "timeout":
        return [starts_dir, 5.0]
    return [starts_dir, 30.0]  # cancel: runs until the driver cancels it


@dataclass(frozen=True)
class Start:
    attempt: int
    pid: int
    pgid: int  # the cluster's main pid
    at: float
    run_id: str


@dataclass
class Submitted:
    execution_id: str
    kind: str
    submitted_at: float
    cancelled_at: float | None = None


class StartsLog:
    """Reads the activities' start lines incrementally (one file per worker process)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.offsets: dict[Path, int] = {}
        self.starts: dict[str, list[Start]] = defaultdict(list)
        self.cluster_of_run: dict[str, int] = {}  # run id -> pgid

    def poll(self) -> list[tuple[str, Start]]:
        """New complete lines since the last poll: (execution id, start) of each."""
        started = []
        for path in sorted(self.directory.glob("starts-*.log")):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            for line in data[:end].decode().splitlines():
                execution_id, attempt, pid, pgid, at, run_id = line.split()
                start = Start(int(attempt), int(pid), int(pgid), float(at), run_id)
                self.starts[execution_id].append(start)
                self.cluster_of_run[run_id] = start.pgid
                started.append((execution_id, start))
        return started


class Driver:
    """Submits the workload at ``rate`` per second and cancels the cancel targets once
    they are seen running."""

    def __init__(self, starts_dir: Path, rate: float, seed: int):
        self.starts_dir = starts_dir
        self.rate = rate
        self.rng = random.Random(seed)
        self.submitted: dict[str, Submitted] = {}
        self.to_cancel: set[str] = set()
        self.starts = StartsLog(starts_dir)
        self.driver_errors: list[str] = []

    def submit_one(self) -> None:
        from executions.ids import ExecutionId
        from workers.testing import submit

        kinds = list(KINDS)
        kind = self.rng.choices(kinds, weights=[KINDS[k][1] for k in kinds])[0]
        ffqn = KINDS[kind][0]
        execution_id = str(ExecutionId.generate())
        args = arguments(kind, str(self.starts_dir), self.rng)
        with_db_retry(lambda: submit(ffqn, args, execution_id=execution_id))
        self.submitted[execution_id] = Submitted(execution_id, kind, time.time())
        if kind == "cancel":
            self.to_cancel.add(execution_id)

    def cancel_started(self) -> None:
        """Cancel the targets that started running; one that cannot be cancelled now (the
        database is away) is tried again on the next tick."""
        from django.db import Error

        from executions import store

        self.starts.poll()
        for execution_id in sorted(self.to_cancel & self.starts.starts.keys()):
            try:
                store.cancel(execution_id)
            except Error:
                continue
            except Exception as error:  # noqa: BLE001 - reported
                self.driver_errors.append(f"cancel {execution_id}: {type(error).__name__}: {error}")
            self.submitted[execution_id].cancelled_at = time.time()
            self.to_cancel.discard(execution_id)

    def run(self, seconds: float) -> None:
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            while len(self.submitted) < elapsed * self.rate:
                self.submit_one()
            self.cancel_started()
            time.sleep(0.05)

    def unfinished(self) -> list[str]:
        from executions.models import ExecutionState

        ids = list(self.submitted)
        finished = set()
        for i in range(0, len(ids), 2000):
            chunk = ids[i : i + 2000]
            finished.update(
                with_db_retry(
                    lambda chunk=chunk: list(
                        ExecutionState.objects.filter(pk__in=chunk, state="finished").values_list("pk", flat=True)
                    )
                )
            )
        return [i for i in ids if i not in finished]

    def wait_all(self, limit: float) -> list[str]:
        """Until everything finished (cancelling late starters meanwhile); returns what is
        still unfinished when ``limit`` runs out."""
        deadline = time.monotonic() + limit
        while True:
            self.cancel_started()
            remaining = self.unfinished()
            if not remaining or time.monotonic() >= deadline:
                return remaining
            time.sleep(1)


# ---------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------


@dataclass
class Analysis:
    execution_id: str
    kind: str
    outcome: str  # ok, err, <failure kind>, unfinished
    reason: str = ""
    finished_at: float | None = None
    expected: bool = True  # the outcome is the workload's own doing (code, time limit, cancel)
    last_attempt_killed: bool = False  # an activity meant to fail lost its last attempt to kill -9
    duplicates: Counter = field(default_factory=Counter)  # cause -> extra runs
    expiry_without_run: int = 0  # retries used by a lock expiry of a claimed, unstarted attempt
    events: list = field(default_factory=list)  # (time, event) of its history


HANDED_BACK = "handed back by a stopping worker"
VANISHED = "lock expired after a worker vanished"
OTHER = "other"


def outcome_of(log) -> tuple[str, str, float | None]:
    from executions.events import Err, ExecutionFailure, Finished, Ok

    for record in reversed(log.events):
        if isinstance(record.event, Finished):
            retval = record.event.retval
            at = record.created_at.timestamp()
            if isinstance(retval, Ok):
                return "ok", "", at
            if isinstance(retval, Err):
                return "err", "", at
            if isinstance(retval, ExecutionFailure):
                return retval.kind, retval.reason or "", at
    return "unfinished", "", None


def expected_outcome(kind: str, outcome: str, reason: str) -> bool:
    """Whether the outcome is the workload's own doing: success, a failure by the
    activity's own code, its own time limit, or the driver's cancellation."""
    if outcome == "ok":
        return True
    if kind == "always_fails":
        return outcome == "err" or (outcome == "uncategorized" and reason.startswith("SoakFailure:"))
    if kind == "timeout":
        return outcome == "timed_out" and reason.startswith("timed out after")
    if kind == "cancel":
        return outcome == "cancelled"
    return False


def attempts_of(log) -> tuple[dict[int, int], dict[int, list]]:
    """Per attempt number (as the run sees it: intermittent failures so far + 1): how many
    locks it got, and the events that ended them."""
    from executions.events import Finished, Locked, TemporarilyFailed, TemporarilyTimedOut, Unlocked

    attempt, locks, ends = 1, Counter(), defaultdict(list)
    for record in log.events:
        event = record.event
        if isinstance(event, Locked):
            locks[attempt] += 1
        elif isinstance(event, (Unlocked, Finished)):
            ends[attempt].append(event)
        elif isinstance(event, (TemporarilyFailed, TemporarilyTimedOut)):
            ends[attempt].append(event)
            attempt += 1
    return locks, ends


def duplicates_of(log, starts: list, killed_pgids: set[int]) -> tuple[Counter, int]:
    """Runs of the activity's code beyond one per attempt, by cause; and lock expiries
    that cost a retry without losing a run (claimed, never started)."""
    from executions.events import TemporarilyTimedOut, Unlocked

    locks, ends = attempts_of(log)
    by_attempt = defaultdict(list)
    for start in starts:
        by_attempt[start.attempt].append((start.at, start.pgid))
    found, expiry_without_run = Counter(), 0
    last_started = max(by_attempt, default=0)
    for attempt in set(by_attempt) | set(ends):
        runs = sorted(by_attempt.get(attempt, []))
        if not locks.get(attempt):
            found[OTHER + " (a start the history has no lock for)"] += len(runs)
            continue
        if len(runs) > 1:  # the same attempt ran again: only an Unlocked keeps the attempt number
            handed_back = any(isinstance(e, Unlocked) and e.reason.startswith("handed back") for e in ends[attempt])
            found[HANDED_BACK if handed_back else OTHER + " (same attempt started twice)"] += len(runs) - 1
        expired = [
            e
            for e in ends[attempt]
            if isinstance(e, TemporarilyTimedOut) and (e.reason or "").startswith("lock expired")
        ]
        if expired and not runs:
            expiry_without_run += 1
        elif expired and last_started > attempt:  # the run was lost and done again as the next attempt
            vanished = runs[-1][1] in killed_pgids
            found[VANISHED if vanished else OTHER + " (lock expired while its worker lived)"] += 1
    return found, expiry_without_run


def last_attempt_killed(kind: str, log, kill_times: list[float]) -> bool:
    """An activity meant to fail (always failing, or timing out with no retries) spends
    its whole retry budget by design, so the kill -9 of the worker running its last
    attempt finishes it as timed out by lock expiry: the fault's expected effect, not an
    engine defect. True when its final lock was taken before a kill and expired after it."""
    from executions.events import Finished, Locked

    if kind not in ("always_fails", "timeout") or not log.events or not isinstance(log.events[-1].event, Finished):
        return False
    reason = getattr(log.events[-1].event.retval, "reason", None) or ""
    locks = [r.created_at.timestamp() for r in log.events if isinstance(r.event, Locked)]
    finished = log.events[-1].created_at.timestamp()
    return reason.startswith("lock expired") and bool(locks) and any(locks[-1] < t < finished for t in kill_times)


def analyse(driver: Driver, faults: list[Fault]) -> dict[str, Analysis]:
    from executions import store

    kills = [f for f in faults if f.what.startswith("kill -9")]
    killed_pgids = {f.cluster_pgid for f in kills}
    driver.starts.poll()
    results = {}
    for execution_id, submitted in driver.submitted.items():
        log = with_db_retry(lambda execution_id=execution_id: store.get(execution_id))
        outcome, reason, finished_at = outcome_of(log)
        duplicates, expiry_without_run = duplicates_of(log, driver.starts.starts.get(execution_id, []), killed_pgids)
        results[execution_id] = Analysis(
            execution_id, submitted.kind, outcome, reason, finished_at,
            expected=outcome != "unfinished" and expected_outcome(submitted.kind, outcome, reason),
            duplicates=duplicates, expiry_without_run=expiry_without_run,
            last_attempt_killed=last_attempt_killed(submitted.kind, log, [f.at for f in kills]),
            events=[(record.created_at.timestamp(), record.event) for record in log.events],
        )  # fmt: skip
    return results


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------


def clock(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%H:%M:%S.%f")[:-3]


def print_totals(results: dict[str, Analysis]) -> None:
    print("\nTotals by expected kind → outcome")
    by_kind = defaultdict(Counter)
    for a in results.values():
        by_kind[a.kind][a.outcome] += 1
    for kind in KINDS:
        outcomes = ", ".join(f"{o} {n}" for o, n in by_kind[kind].most_common())
        print(f"  {kind:<13} {sum(by_kind[kind].values()):>6}   {outcomes}")
    overall = Counter(a.outcome for a in results.values())
    print(f"  {'all':<13} {len(results):>6}   " + ", ".join(f"{o} {n}" for o, n in overall.most_common()))
    reasons = Counter((a.kind, a.outcome, a.reason.split(":")[0][:60]) for a in results.values() if a.reason)
    print("  final failure reasons:")
    for (kind, outcome, reason), n in sorted(reasons.items()):
        print(f"    {kind:<13} {outcome:<14} {n:>5}  {reason}")


def print_unexpected(results: dict[str, Analysis], list_limit: int) -> None:
    from executions import store
    from executions.display import format_history

    failed = [a for a in results.values() if a.outcome != "unfinished" and not a.expected]
    bad = [a for a in failed if not a.last_attempt_killed]
    killed = [a for a in failed if a.last_attempt_killed]
    unfinished = [a for a in results.values() if a.outcome == "unfinished"]
    banner = "=" * 88
    print(f"\n{banner}")
    print(f"  FAILED FOR REASONS OTHER THAN THEIR OWN CODE OR TIME LIMIT: {len(bad)} (must be 0)")
    print(f"  NOT FINISHED WITHIN THE SAFETY LIMIT: {len(unfinished)} (must be 0)")
    print(banner)
    print(f"  (not counted above: {len(killed)} activities meant to fail lost their last attempt to the kill -9,")
    print("   so they finished as timed out by lock expiry" + "".join(f"\n     {a.execution_id}" for a in killed) + ")")
    for a in (bad + unfinished)[:list_limit]:
        print(f"\n  {a.execution_id} ({a.kind}): {a.outcome} {a.reason}")
        for line in format_history(with_db_retry(lambda a=a: store.get(a.execution_id))):
            print(f"  {line}")
    if len(bad) + len(unfinished) > list_limit:
        print(f"\n  … and {len(bad) + len(unfinished) - list_limit} more (raise --list-limit)")


def print_duplicates(results: dict[str, Analysis], driver: Driver) -> None:
    total_starts = sum(len(v) for v in driver.starts.starts.values())
    causes = Counter()
    for a in results.values():
        causes.update(a.duplicates)
    executions = sum(1 for a in results.values() if a.duplicates)
    print(
        f"\nDuplicated runs: {sum(causes.values())} extra run(s) in {executions} execution(s), of {total_starts} starts"
    )
    for cause in (HANDED_BACK, VANISHED):
        print(f"  {cause:<52} {causes.pop(cause, 0):>5}")
    print(f"  {OTHER:<52} {sum(causes.values()):>5}")
    for cause, n in causes.most_common():
        print(f"    {cause:<50} {n:>5}")
    burnt = sum(a.expiry_without_run for a in results.values())
    print(f"  (lock expiries that used a retry without losing a run, claimed but never started: {burnt})")


def first_finish_after(at: float) -> float | None:
    from django.db.models import Min

    from executions.models import ExecutionEvent

    finishes = ExecutionEvent.objects.filter(variant="finished", created_at__gt=datetime.fromtimestamp(at, UTC))
    first = with_db_retry(lambda: finishes.aggregate(t=Min("created_at"))["t"])
    return first.timestamp() - at if first else None


def lock_end(event) -> str:
    """How a lock ended, in a few words (the reason up to its first colon)."""
    from executions.events import Finished, TemporarilyFailed, TemporarilyTimedOut, Unlocked

    if isinstance(event, Finished):
        retval = event.retval
        kind = getattr(retval, "kind", None) or type(retval).__name__.lower()
        reason = (getattr(retval, "reason", None) or "").split(":")[0]
        return f"finished {kind}" + (f" ({reason})" if reason and kind != "uncategorized" else "")
    if isinstance(event, Unlocked):
        return f"unlocked ({event.reason.split(':')[0]})"
    if isinstance(event, TemporarilyTimedOut):
        return f"temporarily timed out ({(event.reason or 'no reason').split(':')[0]})"
    if isinstance(event, TemporarilyFailed):
        return "temporarily failed (its own code)"
    return event.VARIANT


def locked_at(fault: Fault, results: dict[str, Analysis], driver: Driver) -> dict[str, list]:
    """Executions locked when the fault struck, by holder: the lost cluster, the other
    clusters, or a claim none of whose batch ever started (its cluster is unknown); each
    with how and when (after the fault) its lock ended and when it finished. A lock's run
    id is its claim's, shared by the batch, so a start anywhere in the batch names the
    cluster that held it."""
    from executions.events import Locked

    groups = defaultdict(list)
    for a in results.values():
        before = [e for t, e in a.events if t <= fault.at]
        if not before or not isinstance(before[-1], Locked):
            continue
        later = [(t, e) for t, e in a.events if t > fault.at]
        ended_at, end = later[0] if later else (None, None)
        pgid = driver.starts.cluster_of_run.get(before[-1].run_id)
        if pgid is None:
            holder = "by a claim that never started"
        elif pgid == fault.cluster_pgid:
            holder = f"held by {fault.cluster}"
        else:
            holder = "held by other clusters" if fault.cluster else "held by a cluster"
        groups[holder].append((a, ended_at, end))
    return groups


def print_locked_at(fault: Fault, results: dict[str, Analysis], driver: Driver) -> None:
    groups = locked_at(fault, results, driver)
    if not groups:
        print("      nothing was locked at the fault")
    for holder, items in sorted(groups.items()):
        ends = Counter(lock_end(end) if end is not None else "still locked" for _, _, end in items)
        released = [ended_at - fault.at for _, ended_at, _ in items if ended_at is not None]
        finished = [a.finished_at - fault.at for a, _, _ in items if a.finished_at is not None]
        print(f"      locked at the fault, {holder}: {len(items)}; lock ended: "
              + ", ".join(f"{what} {n}" for what, n in ends.most_common()))  # fmt: skip
        print(f"        last lock ended {max(released, default=0):.2f} s after the fault; "
              f"last of them finished {max(finished, default=0):.2f} s after"
              + (f" ({len(items) - len(finished)} never finished)" if len(finished) < len(items) else ""))  # fmt: skip


def print_faults(faults: list[Fault], results: dict[str, Analysis], driver: Driver, fault_errors: list[str]) -> None:
    print("\nFaults and recovery (first execution finished after the fault)")
    for fault in faults:
        victim = f" [{fault.cluster}, pid {fault.cluster_pgid}]" if fault.cluster else ""
        print(f"  {clock(fault.at)}  {fault.what}{victim}")
        after = first_finish_after(fault.at)
        print(f"      first finish after the fault: {'none' if after is None else f'{after:.2f} s'}")
        if fault.cluster is None and fault.completed_at is not None:
            after = first_finish_after(fault.completed_at)
            print(f"      first finish after the restart completed: {'none' if after is None else f'{after:.2f} s'}")
        if fault.note:
            print(f"      {fault.note}")
        print_locked_at(fault, results, driver)
    for error in fault_errors:
        print(f"  fault injection error: {error}")


def print_throughput(results: dict[str, Analysis], driver: Driver) -> None:
    finished = [a.finished_at for a in results.values() if a.finished_at is not None]
    if not finished:
        print("\nThroughput: nothing finished")
        return
    first_submit = min(s.submitted_at for s in driver.submitted.values())
    span = max(finished) - first_submit
    print(f"\nThroughput: {len(finished)} finished in {span:.1f} s (first submit to last finish): "
          f"{len(finished) / span:.1f} finished/s")  # fmt: skip


def print_clusters(fleet: Fleet) -> None:
    print("\nClusters (log: Traceback count, 'database unavailable' / 'available again' lines, ERROR lines)")
    for cluster in fleet.all:
        s = cluster.log_summary()
        errors = sum(n for n, _ in s["errors"].values())
        print(f"  {cluster.name} pid {cluster.pid:<7} tracebacks {s['tracebacks']:>3}  unavailable {s['unavailable']:>3}  "
              f"available again {s['available_again']:>3}  errors {errors:>3}   {cluster.fate}")  # fmt: skip
        print(f"      {cluster.log_path}")
        for message, (n, last) in sorted(s["errors"].items(), key=lambda item: -item[1][0])[:3]:
            print(f"      ERROR ×{n}, last at {last}: {message}")


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------


def setup_django(url: str) -> None:
    os.environ.update(
        DATABASE_URL=url,
        DJANGO_SETTINGS_MODULE="obelisk_site.settings",
        OBELISK_COMPONENT_MODULES="bench.soak_activities",
    )
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()


def fault_plan(seconds: float, fleet: Fleet, chooser: VictimChooser, pg: ThrowawayPostgres, faults: list[Fault]):
    return [
        (seconds * 0.25, lambda: kill_nine(fleet, chooser, faults)),
        (seconds * 0.50, lambda: sigterm(fleet, chooser, faults)),
        (seconds * 0.75, lambda: pg_restart(pg, faults)),
    ]


def soak(args, pg: ThrowawayPostgres, fleet: Fleet, work_dir: Path) -> None:
    starts_dir = work_dir / "starts"
    starts_dir.mkdir()
    os.chmod(starts_dir, 0o777)
    for cluster in [fleet.start_one(), fleet.start_one(), fleet.start_one()]:
        if not cluster.wait_ready():
            sys.exit(f"{cluster.name} did not start:\n{cluster.log()[-5000:]}")
    print(f"3 clusters ready; submitting for {args.minutes:g} min at {args.rate:g}/s", file=sys.stderr)

    seconds = args.minutes * 60
    driver = Driver(starts_dir, args.rate, args.seed)
    faults: list[Fault] = []
    fault_errors: list[str] = []
    stop = threading.Event()
    chooser = VictimChooser(fleet, starts_dir, driver.submitted)
    plan = fault_plan(seconds, fleet, chooser, pg, faults)
    thread = threading.Thread(target=run_faults, args=(plan, stop, fault_errors), daemon=True)
    thread.start()
    try:
        driver.run(seconds)
        print(f"submitted {len(driver.submitted)}; waiting for them to finish", file=sys.stderr)
        thread.join()
        remaining = driver.wait_all(args.wait_limit)
    finally:
        stop.set()
        thread.join(5)  # an interrupted run does not wait for a fault in progress
    print(f"{len(remaining)} unfinished; analysing", file=sys.stderr)

    results = analyse(driver, faults)
    print(f"\nObelisk soak: {args.minutes:g} min at {args.rate:g} submissions/s, 3 clusters × 2 workers, "
          f"PostgreSQL {pg.bin.parent.name} on port {pg.port}")  # fmt: skip
    print_unexpected(results, args.list_limit)
    print_totals(results)
    print_duplicates(results, driver)
    print_faults(faults, results, driver, fault_errors)
    print_throughput(results, driver)
    print_clusters(fleet)
    for error in driver.driver_errors:
        print(f"  driver error: {error}")
    print(f"\nLogs and start records kept in {work_dir}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=3, help="how long to submit work (faults are spaced over it)")
    parser.add_argument("--rate", type=float, default=15, help="submissions per second")
    parser.add_argument("--wait-limit", type=float, default=180, help="safety limit (s) for everything to finish")
    parser.add_argument("--list-limit", type=int, default=50, help="most failed executions whose history is listed")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    work_dir = Path(tempfile.mkdtemp(prefix="obelisk-soak."))
    pg = ThrowawayPostgres()
    fleet = None
    try:
        pg.start()
        url = pg.create_database()
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=child_env(url), check=True)
        setup_django(url)
        fleet = Fleet(url, work_dir)
        soak(args, pg, fleet, work_dir)
    finally:
        if fleet is not None:
            fleet.stop_all()
            from django.db import connections

            connections.close_all()
        pg.stop()


if __name__ == "__main__":
    main()
