#!/usr/bin/env python
"""Workflow benchmark on PostgreSQL, next to the same run's baselines, in one run.

Usage: python bench/workflows.py [--database-url postgres://postgres@127.0.0.1:5432/postgres] [--runs 3]

It creates (and drops) its own database ``obelisk_bench_workflows_<checkout>_<pid>`` on that server
and measures, with no-op activities as children (``bench/workflow_components.py``):

- sequential calls (Obelisk's "fibo" shape): one workflow making N direct calls
  (``ctx.call`` in a loop), N = 100, 400, 800; ms per child call from the workflow's
  ``Created`` to its ``Finished`` event (bar: <= 5 ms per call);
- parallel children: 200 children submitted to one join set, then all awaited;
  children/s over the same span (bar: >= 1,000/s);
- both for a workflow with ``blocking="await"`` and one with ``blocking="interrupt"``;
- replay: a history of 1k and of 10k recorded events (``ctx.random_u64`` calls), built once
  by the cluster, then replayed in this process with ``replay.EventHistory`` and the function
  (a writer that refuses every write: everything must match); ms per replay, the ratio
  10k / 1k (linear: about 10) and the bar of < 1 s for 10k events. The sequential history
  of the largest N is replayed too, as the shape an Interrupt run replays at every response;
- CPU seconds of the worker cluster's processes and their resident memory (from /proc),
  and the CPU of the whole PostgreSQL server (shared with anything else on it);
- one step: a workflow with one activity step (the sequential workflow with N = 1),
  submitted and waited for back to back (``client.submit`` → ``client.wait``), p50 and p99.

Baselines, same run, same server: ``pgbench`` one-row insert (1 client), the no-op
activity drain of bench/run.py (executions/s, 3 events each), and DBOS Transact, the
Postgres-backed peer (``../shared/baselines/dbos`` next to this repository, or ``--dbos
DIR``): its ``workflows.py`` (run.sh's steps) for the sequential and parallel shapes, and
``bench/dbos_one_step.py`` (run with that baseline's virtualenv) for the one-step shape; a
table of ratios closes the output (issue 40). Without the baseline, or when its virtualenv cannot be made, the DBOS
columns stay empty and a note says why. ``--runs 3`` runs it all three times over, one after
another, and closes with one ratio table whose cells are min / median / max.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import bench.run  # noqa: E402
from bench.run import (  # noqa: E402
    Cluster,
    child_env,
    cpu_seconds,
    drain,
    percentile,
    pgbench,
    postmaster_pid,
    process_tree,
    recreate_database,
    rss_mib,
    stop_with_the_benchmark,
)

# A database of its own, named after the checkout and this process (D106), so that no other
# run, of this script or bench/run.py, here or in another checkout, drops it.
bench.run.BENCH_DB = bench.run.own_database_name("obelisk_bench_workflows")

MODULES = "bench.components,bench.workflow_components"
# Measured as deployed: DJANGO_DEBUG defaults to 1 (every query timed and kept by Django).
EXTRA_ENV = {"OBELISK_COMPONENT_MODULES": MODULES, "DJANGO_DEBUG": "0"}
SEQUENTIAL = {"await": "bench:wf/ifc.sequential-await", "interrupt": "bench:wf/ifc.sequential-interrupt"}
PARALLEL = {"await": "bench:wf/ifc.parallel-await", "interrupt": "bench:wf/ifc.parallel-interrupt"}
RECORDED = "bench:wf/ifc.recorded-calls"
CALL_BAR_MS = 5.0
ONE_STEP = SEQUENTIAL  # the sequential workflow with N = 1: one activity step
# The DBOS baseline, next to this repository (``--dbos`` or ``DBOS_DIR`` override it), and
# the virtualenv its run.sh makes, which also runs bench/dbos_one_step.py.
DBOS_DIR = Path(os.environ.get("DBOS_DIR", ROOT.parent / "shared" / "baselines" / "dbos"))
DBOS_TARGET = 0.5  # issue 40: ms per step and one-step p50 <= 0.5 x DBOS's
DBOS_CHILDREN_TARGET = 10.0  # parallel children/s >= 10 x DBOS's ...
DRAIN_CHILDREN_TARGET = 0.3  # ... and >= 0.3 x the engine's own drain
PARALLEL_BAR = 1000.0
REPLAY_BAR_MS = 1000.0


# ---------------------------------------------------------------------------------------
# CPU and memory from /proc (no psutil): the helpers live in bench/run.py
# ---------------------------------------------------------------------------------------


class Meter:
    """CPU of the worker cluster and of the server between ``start`` and ``stop``; the
    cluster's peak resident memory, sampled every 0.2 s in between."""

    def __init__(self, cluster_pid: int, server_pid: int | None):
        self.cluster_pid, self.server_pid = cluster_pid, server_pid
        self._stop = threading.Event()

    def _cpu(self) -> tuple[float, float]:
        worker = cpu_seconds(process_tree(self.cluster_pid), self.cluster_pid)
        server = cpu_seconds(process_tree(self.server_pid), self.server_pid) if self.server_pid else float("nan")
        return worker, server

    def __enter__(self) -> Meter:
        self.peak_rss = (0.0, 0.0)
        self._stop.clear()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()
        self._cpu0 = self._cpu()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            total, largest = rss_mib(process_tree(self.cluster_pid))
            self.peak_rss = (max(self.peak_rss[0], total), max(self.peak_rss[1], largest))

    def __exit__(self, *exc) -> None:
        cpu1 = self._cpu()
        self._stop.set()
        self._sampler.join()
        self.worker_cpu = cpu1[0] - self._cpu0[0]
        self.server_cpu = cpu1[1] - self._cpu0[1]


# ---------------------------------------------------------------------------------------
# Running workflows on the cluster
# ---------------------------------------------------------------------------------------


class WorkflowCluster(Cluster):
    """``manage.py obelisk_worker`` serving the no-op activity and the bench workflows."""

    def __init__(self, url: str, workers: int):
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "obelisk_worker", "--workers", str(workers)],
            cwd=ROOT,
            env={**child_env(url), **EXTRA_ENV},
            stdout=subprocess.DEVNULL,
            stderr=open(ROOT / "var" / "bench-workflows-worker.log", "w"),  # noqa: SIM115
            preexec_fn=stop_with_the_benchmark,
        )


@dataclass
class Run:
    what: str
    n: int
    seconds: float  # Created → Finished, from the log
    runs: int  # distinct run ids of its Locked events: how many runs the workflow took
    events: int
    worker_cpu: float
    server_cpu: float
    rss: tuple[float, float]
    execution_id: str = ""


def run_workflow(ffqn: str, n: int, meter: Meter, timeout: float) -> Run | None:
    """Submit ``ffqn(n)`` and wait for it; None (and the execution cancelled, so it does not
    weigh on the next measure) when it does not finish within ``timeout`` seconds."""
    from executions import errors, store
    from executions.events import Created, Finished, Locked, Ok
    from workers.testing import submit

    with meter:
        execution_id, _ = submit(ffqn, [n])
        try:
            retval = store.wait_for_finished_result(execution_id, timeout=timeout)
        except errors.Timeout:
            store.cancel(execution_id)
            return None
    if not isinstance(retval, Ok):
        raise SystemExit(f"{ffqn}({n}) did not succeed: {retval}")
    log = store.get(execution_id)
    created = next(r.created_at for r in log.events if isinstance(r.event, Created))
    finished = next(r.created_at for r in log.events if isinstance(r.event, Finished))
    return Run(
        what=ffqn,
        n=n,
        seconds=(finished - created).total_seconds(),
        runs=len({r.event.run_id for r in log.events if isinstance(r.event, Locked)}),
        events=len(log.events),
        worker_cpu=meter.worker_cpu,
        server_cpu=meter.server_cpu,
        rss=meter.peak_rss,
        execution_id=execution_id,
    )


# ---------------------------------------------------------------------------------------
# Replay in this process
# ---------------------------------------------------------------------------------------


class RefuseWrites:
    """A replay of a complete history writes nothing; a write would be a mismatch."""

    def append(self, version, events, creates):
        raise AssertionError(f"replay tried to write {len(events)} event(s) at version {version}")

    def stub(self, ffqn, target, retval):
        raise AssertionError("replay tried to stub")


def replay_once(log, spec) -> float:
    """One replay of a finished workflow's whole history: seconds."""
    from executions.events import Created, HistoryEventRecord
    from workers import determinism
    from workers.replay import EventHistory
    from workers.workflow import WorkflowContext

    execution_id = log.state.execution_id
    params = next(r.event.params for r in log.events if isinstance(r.event, Created))
    history = [r for r in log.events if isinstance(r.event, HistoryEventRecord)]
    started = time.perf_counter()
    events = EventHistory(execution_id, history, log.responses, next_version=log.next_version, writer=RefuseWrites())
    ctx = WorkflowContext(events, execution_id)
    with determinism.guarding():
        spec.fn(ctx, *spec.decode_arguments(params))
    events.finalize()
    elapsed = time.perf_counter() - started
    if events.is_replaying or events.poisoned is not None:
        raise SystemExit(f"replay of {execution_id} did not match its history")
    return elapsed


def replay(execution_id: str, repeat: int) -> dict:
    from executions import store
    from executions.events import HistoryEventRecord
    from workers.components import load_components

    started = time.perf_counter()
    log = store.get(execution_id)
    load = time.perf_counter() - started
    spec = load_components()[log.state.ffqn]
    replay_once(log, spec)  # warm-up
    cpu0 = time.process_time()
    samples = [replay_once(log, spec) for _ in range(repeat)]
    cpu = (time.process_time() - cpu0) / repeat
    return {
        "events": sum(1 for r in log.events if isinstance(r.event, HistoryEventRecord)),
        "responses": len(log.responses),
        "ms": min(samples) * 1000,  # the least disturbed by other work on the machine
        "cpu_ms": cpu * 1000,
        "load_ms": load * 1000,
    }


def profile_replay(execution_id: str, top: int) -> str:
    import cProfile
    import io
    import pstats

    from executions import store
    from workers.components import load_components

    log = store.get(execution_id)
    spec = load_components()[log.state.ffqn]
    profiler = cProfile.Profile()
    profiler.enable()
    replay_once(log, spec)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


# ---------------------------------------------------------------------------------------
# One step: submit -> result, back to back
# ---------------------------------------------------------------------------------------


def one_step(ffqn: str, count: int) -> dict:
    """``count`` one-step workflows, each submitted and waited for before the next, through
    the Python client, as a user's code would: p50 and p99 (ms) of submit -> result."""
    from executions import client

    def once() -> float:
        started = time.perf_counter()
        execution_id = client.submit(ffqn, [1]).execution_id
        result = client.wait(execution_id, timeout=60, release_connection=False)
        if result != {"ok": 1}:
            raise SystemExit(f"{ffqn}(1) did not succeed: {result}")
        return (time.perf_counter() - started) * 1000

    for _ in range(5):  # warm-up: this process's statements prepared, the pool's thread started
        once()
    samples = [once() for _ in range(count)]
    return {"n": count, "p50": percentile(samples, 0.5), "p99": percentile(samples, 0.99)}


# ---------------------------------------------------------------------------------------
# The DBOS baseline (issue 40): run.sh's steps, and our one-step script in its virtualenv
# ---------------------------------------------------------------------------------------


def dbos_python() -> Path:
    """The virtualenv run.sh makes (once) and runs DBOS in."""
    venv = os.environ.get("DBOS_VENV") or str(Path(os.environ.get("TMPDIR") or "/tmp") / "dbos-baseline-venv")
    return Path(venv) / "bin" / "python"


def dbos_records(stdout: str) -> list[dict]:
    """The JSON lines of a DBOS run; anything else it prints is ignored."""
    records = []
    for line in stdout.splitlines():
        if line.startswith("{"):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


def dbos_venv(directory: Path, note) -> Path | None:
    """The baseline's virtualenv python, made as its run.sh makes it (the DBOS version read
    from run.sh) when it is not there yet; None, with a note, when it cannot be made."""
    python = dbos_python()
    if python.exists():
        return python
    pin = re.search(r"dbos==[0-9][0-9.]*", (directory / "run.sh").read_text())
    if pin is None:
        note(f"DBOS baseline skipped: no dbos==<version> in {directory / 'run.sh'}")
        return None
    venv = python.parent.parent
    note(f"DBOS baseline: making its virtualenv {venv} ({pin.group(0)})")
    try:
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True, capture_output=True, timeout=600)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", pin.group(0), "psycopg[binary]"],
            check=True, capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError) as error:
        detail = getattr(error, "stderr", "") or error
        note(f"DBOS baseline skipped: its virtualenv cannot be installed: {str(detail).strip()[-500:]}")
        return None
    return python


def dbos_baseline(admin_url: str, sizes: list[int], directory: Path, one_step_count: int, note) -> dict | None:
    """DBOS on the same server: ``{"sequential": {n: ms_per_step}, "parallel": children_per_s,
    "one_step": {"p50", "p99"}}`` (what it printed), or None, with a note, when the baseline
    is absent or cannot run (its virtualenv cannot be installed, no network, ...).

    The steps of its run.sh (the virtualenv, then its ``workflows.py`` on a database), not
    run.sh itself: run.sh drops and recreates the fixed database ``dbos_baseline`` WITH
    (FORCE), which kills another run's baseline on the same server (why: D106, as for
    q2claim in bench/run.py). Its database here is ``<BENCH_DB>_dbos``, created for it and
    dropped after it; bench/dbos_one_step.py makes and drops ``<BENCH_DB>_dbos1``."""
    if not (directory / "run.sh").exists() or not (directory / "workflows.py").exists():
        note(f"no DBOS baseline at {directory} (--dbos, DBOS_DIR): its columns stay empty")
        return None
    python = dbos_venv(directory, note)
    if python is None:
        return None
    name = f"{bench.run.BENCH_DB}_dbos"
    url = bench.run.create_database(admin_url, name).replace("postgres://", "postgresql://", 1)
    note(f"baseline: DBOS ({directory / 'workflows.py'} on {name}, N = {' '.join(map(str, sizes))})")
    try:
        out = subprocess.run(
            [str(python), str(directory / "workflows.py"), url, *map(str, sizes)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        note("DBOS baseline: it took over 30 minutes; its columns stay empty")
        return None
    finally:
        bench.run.drop_own_database(admin_url, name)
    if out.returncode:
        tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-5:])
        note(f"DBOS baseline skipped: its workflows.py failed ({out.returncode}):\n{tail}")
        return None
    figures: dict = {"sequential": {}, "parallel": None, "one_step": None}
    for record in dbos_records(out.stdout):
        if record.get("workload") == "sequential_steps":
            figures["sequential"][int(record["n"])] = float(record["ms_per_step"])
        elif record.get("workload") == "parallel_children":
            figures["parallel"] = float(record["children_per_s"])
    if one_step_count:
        note(f"baseline: DBOS one step, {one_step_count} workflows (bench/dbos_one_step.py)")
        name = f"{bench.run.BENCH_DB}_dbos1"
        out = subprocess.run(
            [str(python), str(ROOT / "bench" / "dbos_one_step.py"), admin_url, name, str(one_step_count)],
            capture_output=True, text=True, timeout=1800,
        )  # fmt: skip
        found = [r for r in dbos_records(out.stdout) if r.get("workload") == "one_step"]
        if out.returncode or not found:
            tail = "\n".join((out.stderr or out.stdout).strip().splitlines()[-5:])
            note(f"DBOS one step failed ({out.returncode}); its column stays empty:\n{tail}")
        else:
            figures["one_step"] = {"p50": float(found[0]["p50_ms"]), "p99": float(found[0]["p99_ms"])}
    return figures


def ratio_rows(sequential: dict, parallel: dict, steps: dict, drained: dict, dbos: dict | None) -> list[dict]:
    """One row per shape and strategy: this engine's figure, DBOS's, their ratio (engine /
    DBOS: ms per step and p50, lower is better, target <= 0.5; children/s, higher is
    better, target >= 10, and >= 0.3 of the engine's own drain)."""
    dbos = dbos or {"sequential": {}, "parallel": None, "one_step": None}
    rows = []

    def add(shape: str, strategy: str, engine: float, peer: float | None, unit: str, target: str, **more) -> None:
        ratio = engine / peer if peer else None
        rows.append(
            dict(
                shape=shape, strategy=strategy, engine=engine, peer=peer, ratio=ratio, unit=unit, target=target, **more
            )
        )

    for strategy, runs in sequential.items():
        for run in (r for r in runs if isinstance(r, Run)):
            peer = dbos["sequential"].get(run.n)
            add(f"sequential, N={run.n}", strategy, run.seconds * 1000 / run.n, peer, "ms/step", f"<= {DBOS_TARGET:g}")
    for strategy, result in steps.items():
        peer = dbos["one_step"]
        shape = f"one step, submit -> result p50 (n={result['n']})"
        add(shape, strategy, result["p50"], peer and peer["p50"], "ms", f"<= {DBOS_TARGET:g}")
        add("one step, submit -> result p99", strategy, result["p99"], peer and peer["p99"], "ms", "")
    for strategy, runs in parallel.items():
        done = sorted((r for r in runs if isinstance(r, Run)), key=lambda r: r.n / r.seconds)
        if done:
            rate = done[len(done) // 2].n / done[len(done) // 2].seconds
            add(
                f"parallel join set, {done[0].n} children", strategy, rate, dbos["parallel"], "children/s",
                f">= {DBOS_CHILDREN_TARGET:g} (>= {DRAIN_CHILDREN_TARGET:g})", own_drain=rate / drained["exec_s"],
            )  # fmt: skip
    return rows


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f} {unit}" if unit == "children/s" else f"{value:.2f} {unit}"


def _ratio(row: dict) -> str:
    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
    return f"{ratio} (own drain {row['own_drain']:.2f})" if "own_drain" in row else ratio


def _table_line(shape: str, strategy: str, engine: str, peer: str, ratio: str, target: str, widths=(18, 18, 22)) -> str:
    return (
        f"{shape:<40} | {strategy:<9} | {engine:>{widths[0]}} | {peer:>{widths[1]}} | {ratio:>{widths[2]}} | {target}"
    )


def ratio_table(rows: list[dict]) -> list[str]:
    """The ratio rows of one run, as lines."""
    lines = [_table_line("shape", "strategy", "this engine", "DBOS", "ratio", "target")]
    lines.append("-" * len(lines[0]))
    for row in rows:
        unit = row["unit"]
        lines.append(
            _table_line(
                row["shape"],
                row["strategy"],
                _figure(row["engine"], unit),
                _figure(row["peer"], unit),
                _ratio(row),
                row["target"],
            )
        )
    return lines


def runs_table(runs: list[list[dict]]) -> list[str]:
    """The ratio rows of several runs, each cell min / median / max over the runs that
    measured it (a shape one run skipped counts in fewer)."""

    def spread(values: list[float], spec: str) -> str:
        values = sorted(v for v in values if v is not None)
        if not values:
            return "-"
        middle = statistics.median(values)
        return " / ".join(format(v, spec) for v in (values[0], middle, values[-1]))

    grouped: dict[tuple[str, str], list[dict]] = {}
    for rows in runs:
        for row in rows:
            grouped.setdefault((row["shape"], row["strategy"]), []).append(row)
    widths = (32, 32, 52)
    lines = [_table_line("shape", "strategy", "this engine", "DBOS", "ratio", "target", widths)]
    lines.append("-" * len(lines[0]))
    for (shape, strategy), rows in grouped.items():
        unit = rows[0]["unit"]
        spec = ",.0f" if unit == "children/s" else ".2f"
        ratio = spread([r["ratio"] for r in rows], ".2f")
        if "own_drain" in rows[0]:
            ratio += f" (own drain {spread([r['own_drain'] for r in rows], '.2f')})"
        lines.append(
            _table_line(
                shape,
                strategy,
                f"{spread([r['engine'] for r in rows], spec)} {unit}",
                f"{spread([r['peer'] for r in rows], spec)} {unit}",
                ratio,
                rows[0]["target"],
                widths,
            )
        )
    return lines


def repeat_runs(count: int) -> None:
    """``--runs N``: this script N times over, one after another (each with a fresh
    database and its own DBOS run, every output as it is), then their ratio tables as one,
    each cell min / median / max."""
    runs = []
    with tempfile.TemporaryDirectory() as directory:
        for index in range(count):
            print(f"\n=== run {index + 1} of {count}", flush=True)
            out = Path(directory) / f"run{index}.json"
            argv = [a for a in _without_runs(sys.argv[1:])] + ["--ratios-json", str(out)]
            subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv], check=True)
            runs.append(json.loads(out.read_text()))
    print(f"\n{count} runs next to DBOS Transact, each cell min / median / max (ratio: this engine / DBOS, per run)\n")
    for line in runs_table(runs):
        print(line)


def _without_runs(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--runs":
            skip = True
        elif not arg.startswith("--runs="):
            kept.append(arg)
    return kept


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "meets" if ok else "MISSES"


@dataclass
class Skipped:
    """A measure not run: the projection from the smaller run exceeded the time budget, or
    the workflow did not finish within its timeout (then it was cancelled)."""

    n: int
    reason: str


def projected_seconds(previous: Run, n: int, strategy: str) -> float:
    """Time of ``n`` calls from a smaller run: linear under Await; under Interrupt every call
    replays the history so far, so the time grows with the square of N."""
    exponent = 2 if strategy == "interrupt" else 1
    return previous.seconds * (n / previous.n) ** exponent


def settle() -> None:
    """Vacuum and checkpoint before a strategy's runs: the baseline drain and the previous
    strategy leave dead rows whose autovacuum (and a checkpoint) would otherwise run in the
    middle of the next strategy's runs, which are then measured on a busier server than the
    other's (Await, measured first, paid for the drain)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE)")
        cursor.execute("CHECKPOINT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 400, 800], help="N of the sequential workflow")
    parser.add_argument("--parallel", type=int, default=200, help="children in the one join set")
    parser.add_argument("--parallel-repeat", type=int, default=3, help="parallel runs per strategy, at most (median)")
    parser.add_argument("--replay", type=int, nargs=2, default=[1000, 10000], help="history sizes (events)")
    parser.add_argument("--replay-repeat", type=int, default=5)
    parser.add_argument("--strategies", nargs="+", default=["await", "interrupt"], choices=["await", "interrupt"])
    parser.add_argument("--workers", type=int, default=1, help="worker processes in the cluster")
    parser.add_argument("--drain", type=int, default=5000, help="executions in the baseline drain")
    parser.add_argument("--pgbench-seconds", type=int, default=5)
    parser.add_argument(
        "--budget",
        type=float,
        default=60,
        help="seconds: a sequential N whose projected time exceeds it is skipped, parallel runs are repeated "
        "within it, and a workflow still running after 3x is cancelled (keeps the run near 5 minutes)",
    )
    parser.add_argument(
        "--one-step", type=int, default=200, help="one-step workflows submitted back to back (0: not measured)"
    )
    parser.add_argument(
        "--dbos", type=Path, default=DBOS_DIR, metavar="DIR",
        help="the DBOS baseline's directory (default: ../shared/baselines/dbos next to this repository)",
    )  # fmt: skip
    parser.add_argument("--no-dbos", action="store_true", help="do not run the DBOS baseline")
    parser.add_argument("--profile", action="store_true", help="cProfile the 10k replay and print its top functions")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    parser.add_argument(
        "--runs", type=int, default=1, help="repeat the whole run; the ratio table's cells: min / median / max"
    )
    parser.add_argument("--ratios-json", type=Path, help=argparse.SUPPRESS)  # --runs: each run's ratio rows
    args = parser.parse_args()
    if args.runs > 1:
        repeat_runs(args.runs)
        return
    timeout = 3 * args.budget

    if not args.keep:  # also when the run fails or is stopped (SIGTERM unwinds like Ctrl-C)
        atexit.register(bench.run.drop_own_database, args.database_url, bench.run.BENCH_DB)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    url = recreate_database(args.database_url)
    env = {**child_env(url), **EXTRA_ENV}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    os.environ.update(env)
    import django

    django.setup()

    def note(message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    started = time.monotonic()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    note("baseline: pgbench")
    baseline = pgbench(url, 1, args.pgbench_seconds)
    note("baseline: no-op activity drain")
    drained = drain(url, args.workers, args.drain)

    cluster = WorkflowCluster(url, args.workers)
    meter = Meter(cluster.process.pid, postmaster_pid())
    sequential: dict[str, list[Run | Skipped]] = {}
    parallel: dict[str, list[Run | Skipped]] = {}
    built: list[Run | Skipped] = []
    steps: dict[str, dict] = {}
    try:
        note("warm-up")
        for strategy in args.strategies:
            run_workflow(SEQUENTIAL[strategy], 5, meter, timeout)
            run_workflow(PARALLEL[strategy], 5, meter, timeout)
        idle_rss = rss_mib(process_tree(cluster.process.pid))
        for strategy in args.strategies:
            settle()
            rows = sequential.setdefault(strategy, [])
            for n in sorted(args.sizes):
                last = next((r for r in reversed(rows) if isinstance(r, Run)), None)
                if last is not None and (projection := projected_seconds(last, n, strategy)) > args.budget:
                    rows.append(Skipped(n, f"skipped: ~{projection:,.0f} s projected > --budget {args.budget:g}"))
                    continue
                note(f"sequential {strategy} N={n}")
                run = run_workflow(SEQUENTIAL[strategy], n, meter, timeout)
                rows.append(run or Skipped(n, f"not finished in {timeout:g} s: cancelled"))
            rows = parallel.setdefault(strategy, [])
            spent = 0.0
            for i in range(args.parallel_repeat):
                done = [r for r in rows if isinstance(r, Run)]
                if done and spent + spent / len(done) > args.budget:
                    break
                note(f"parallel {strategy} {args.parallel} children ({i + 1}/{args.parallel_repeat})")
                clock = time.monotonic()
                run = run_workflow(PARALLEL[strategy], args.parallel, meter, timeout)
                spent += time.monotonic() - clock
                rows.append(run or Skipped(args.parallel, f"not finished in {timeout:g} s: cancelled"))
                if run is None:
                    break
        if args.one_step:
            for strategy in args.strategies:
                note(f"one step {strategy}: {args.one_step} workflows, submit -> result")
                steps[strategy] = one_step(ONE_STEP[strategy], args.one_step)
        for size in args.replay:
            note(f"building a history of {size} recorded calls")
            run = run_workflow(RECORDED, size, meter, timeout)
            if run is None:
                raise SystemExit(f"building the history of {size} events took over {timeout:g} s")
            built.append(run)
    finally:
        cluster.stop()
    # After the engine's cluster stopped, so that neither measures next to the other's load.
    dbos = (
        None if args.no_dbos else dbos_baseline(args.database_url, sorted(args.sizes), args.dbos, args.one_step, note)
    )

    replays = []
    for run, size in zip(built, args.replay, strict=True):
        note(f"replaying {size} events")
        replays.append(
            replay(run.execution_id, args.replay_repeat if size <= 2000 else max(2, args.replay_repeat // 2))
        )
    tree_replays = []
    for strategy in args.strategies:
        done = [r for r in sequential.get(strategy, []) if isinstance(r, Run)]
        if done:
            note(f"replaying the sequential {strategy} N={done[-1].n} history")
            tree_replays.append((strategy, done[-1].n, replay(done[-1].execution_id, 3)))
    load_after = Path("/proc/loadavg").read_text().split()[:3]

    # -- the table ------------------------------------------------------------------------
    host = urlparse(url)
    print(
        f"\nObelisk for Django: workflows, PostgreSQL at {host.hostname}:{host.port}, {args.workers} worker process(es)"
    )
    print(
        f"baselines (same run): pgbench 1-row insert, 1 client: {baseline['tps']:,.0f} tx/s, "
        f"p50 {baseline['p50']:.2f} ms / p99 {baseline['p99']:.2f} ms;  no-op activity drain: "
        f"{drained['exec_s']:,.0f} exec/s ({drained['events_s']:,.0f} events/s)"
    )
    print(
        f"machine: {os.cpu_count()} CPUs, load average {' '.join(load_before)} at the start, "
        f"{' '.join(load_after)} at the end (other work on the machine inflates every figure); "
        f"this run took {time.monotonic() - started:,.0f} s"
    )
    print(f"worker cluster RSS after warm-up: {idle_rss[0]:.0f} MiB in all, largest process {idle_rss[1]:.0f} MiB\n")
    header = (
        f"{'measure':<38} | {'strategy':<9} | {'result':>17} | {'bar':>11} | {'verdict':<7} | "
        f"{'runs':>5} | {'worker CPU':>14} | {'server CPU':>14} | {'peak RSS MiB':>12}"
    )
    print(header)
    print("-" * len(header))

    def row(what, strategy, result, bar="", ok="", run: Run | None = None, per: float | None = None, unit=""):
        cpu = f"{run.worker_cpu * 1000 / per:.2f} ms/{unit}" if run and per else ""
        server = f"{run.server_cpu * 1000 / per:.2f} ms/{unit}" if run and per else ""
        rss = f"{run.rss[0]:.0f} ({run.rss[1]:.0f})" if run else ""
        runs = f"{run.runs}" if run else ""
        print(
            f"{what:<38} | {strategy:<9} | {result:>17} | {bar:>11} | {ok:<7} | {runs:>5} | {cpu:>14} | "
            f"{server:>14} | {rss:>12}"
        )

    call_bar = f"<= {CALL_BAR_MS:g} ms"
    for strategy in args.strategies:
        for run in sequential.get(strategy, []):
            if isinstance(run, Skipped):
                print(f"{f'sequential ctx.call, N={run.n}':<38} | {strategy:<9} | {run.reason}")
                continue
            per_call = run.seconds * 1000 / run.n
            row(
                f"sequential ctx.call, N={run.n}", strategy, f"{per_call:.2f} ms/call", call_bar,
                verdict(per_call <= CALL_BAR_MS), run, run.n, "call",
            )  # fmt: skip
        runs = [r for r in parallel.get(strategy, []) if isinstance(r, Run)]
        for skipped in (r for r in parallel.get(strategy, []) if isinstance(r, Skipped)):
            print(f"{f'parallel join set, {skipped.n} children':<38} | {strategy:<9} | {skipped.reason}")
        if runs:
            ordered = sorted(runs, key=lambda r: r.n / r.seconds)
            median = ordered[len(ordered) // 2]
            rate = median.n / median.seconds
            row(
                f"parallel join set, {args.parallel} children", strategy, f"{rate:,.0f} children/s",
                f">= {PARALLEL_BAR:,.0f}/s", verdict(rate >= PARALLEL_BAR), median, median.n, "child",
            )  # fmt: skip
            if len(runs) > 1:
                print(f"{'':<38} | {'':<9} | {'of ' + ', '.join(f'{r.n / r.seconds:,.0f}' for r in runs):>17} |")
    for run in built:
        rate = run.n / run.seconds
        row(
            f"recorded calls (random_u64), N={run.n:,}",
            "await",
            f"{rate:,.0f} calls/s",
            run=run,
            per=run.n,
            unit="call",
        )
    for size, result in zip(args.replay, replays, strict=True):
        big = size >= 10000
        row(
            f"replay {result['events']:,} events (in-process)", "-", f"{result['ms']:.1f} ms/replay",
            f"< {REPLAY_BAR_MS:g} ms" if big else "", verdict(result["ms"] < REPLAY_BAR_MS) if big else "",
        )  # fmt: skip
    ratio = replays[1]["cpu_ms"] / replays[0]["cpu_ms"]  # CPU time: steadier than wall time on a busy machine
    size_ratio = replays[1]["events"] / replays[0]["events"]
    row(
        f"replay CPU ratio {replays[1]['events']:,} / {replays[0]['events']:,}", "-", f"{ratio:.2f}",
        f"~{size_ratio:.0f} linear", verdict(ratio <= 1.5 * size_ratio),
    )  # fmt: skip
    for strategy, n, result in tree_replays:
        row(f"replay of the sequential N={n} run", strategy, f"{result['ms']:.1f} ms/replay")
    print()
    for result in replays:
        print(
            f"replay {result['events']:,} events: {result['ms'] * 1000 / result['events']:.1f} µs/event, "
            f"CPU {result['cpu_ms']:.1f} ms/replay; loading the history from the database "
            f"(store.get): {result['load_ms']:.1f} ms"
        )
    for strategy, n, result in tree_replays:
        items = result["events"] + result["responses"]
        print(
            f"replay of the sequential N={n} run ({strategy}): {result['events']:,} history events + "
            f"{result['responses']:,} responses, {result['ms'] * 1000 / items:.1f} µs/item; "
            f"loading it: {result['load_ms']:.1f} ms"
        )
    print(
        "\n(sequential / parallel / recorded calls: the workflow's Created → Finished, from its log, on a warm "
        "cluster; runs: the workflow's runs (distinct run ids of its Locked events); worker CPU: utime+stime of "
        "the cluster's processes per call or child; server CPU: the whole PostgreSQL server's processes, shared "
        "with anything else using it; peak RSS: all cluster processes (largest one), sampled every 0.2 s; "
        "replay: fastest of several in-process replays of a finished workflow's whole history, nothing written)"
    )
    print(
        "\nNext to DBOS Transact (same run, same server; ratio: this engine / DBOS; the issue's targets: "
        "ms per step and one-step p50 <= 0.5 x DBOS's, children/s >= 10 x DBOS's and >= 0.3 x the own drain)\n"
    )
    rows = ratio_rows(sequential, parallel, steps, drained, dbos)
    for text in ratio_table(rows):
        print(text)
    if args.ratios_json:
        args.ratios_json.write_text(json.dumps(rows))
    if dbos is None:
        print("(DBOS not measured in this run: see the note above)")
    for strategy, result in steps.items():
        print(f"one step ({strategy}): submit -> result p50 {result['p50']:.2f} ms, p99 {result['p99']:.2f} ms")
    if args.profile:
        print("\ncProfile of one replay of the largest history:\n")
        print(profile_replay(built[-1].execution_id, 25))
    if not args.keep:
        drop_database(args.database_url)


def drop_database(admin_url: str) -> None:
    """Drop this run's database (only if this process created it)."""
    from django.db import connections

    from executions import notify

    notify.stop_listening()
    connections.close_all()
    bench.run.drop_own_database(admin_url, bench.run.BENCH_DB)


if __name__ == "__main__":
    main()
