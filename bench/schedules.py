#!/usr/bin/env python
"""The cost of a schedule tick (issue 39): the timer sweep's firing pass
(``store.fire_due_schedules``) over N schedules all due at once, per schedule per tick.

For N in ``--counts`` (100 and 1,000) schedules of the no-op activity (bench/components.py),
each a 1-second interval, it times ``--passes`` (3) firing passes one second of the clock
apart (``now=``; no worker runs), and reports the median pass: wall time of the pass, and
per schedule per tick its wall time and this process's CPU time (the ORM and the planning;
the database server's own CPU is not in it). Two overlap policies, the two paths a tick
takes:

- ``allow_all``: every tick creates its execution (the row lock, the plan, the create, the
  tick record, the schedule's progress: one transaction per schedule);
- ``skip``: after the first pass the previous execution still runs (no worker), so every
  tick is recorded as skipped: the pass without the create.

On PostgreSQL and on SQLite, each in a subprocess of this script with a database of its own:
on PostgreSQL ``obelisk_bench_schedules_<checkout>_<pid>`` (bench/support.py's
``own_database``: created, migrated, dropped at the end, D106); on SQLite a file of that
name in the temporary directory, deleted at the end.

Usage: python bench/schedules.py [--counts 100 1000] [--passes 3] [--backends postgres sqlite]
(about a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import FFQN, ROOT, child_env, note, own_database_name  # noqa: E402

DATABASE = "obelisk_bench_schedules"
T0 = datetime(2031, 1, 1, tzinfo=UTC)
POLICIES = ("allow_all", "skip")


@contextmanager
def sqlite_database():
    """A migrated SQLite file of this run's own, Django set up on it; deleted at the end."""
    path = Path(tempfile.gettempdir()) / f"{own_database_name(DATABASE)}.sqlite3"
    if path.exists():
        raise SystemExit(f"{path} exists already; it is not this run's, so it is left alone")
    url = f"sqlite:///{path}"
    note(f"benchmark database: {path}")
    try:
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=child_env(url), check=True)
        os.environ.update(child_env(url))
        import django

        django.setup()
        yield url
    finally:
        if "django" in sys.modules and sys.modules["django"].apps.apps.ready:
            from django.db import connections

            connections.close_all()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def measure(counts: list[int], passes: int) -> list[dict]:
    """Django is set up on the benchmark database: the rows of the table."""
    from deployments.registration import ensure_code_deployment
    from executions import schedules, store
    from workers.components import load_components

    ensure_code_deployment(load_components(["bench.components"]), activate=True)
    rows = []
    for count in counts:
        for policy in POLICIES:
            ids = [f"bench-{policy}-{count}-{n}" for n in range(count)]
            for schedule_id in ids:
                request = schedules.ScheduleRequest(schedule_id, FFQN, [], interval_seconds=1, overlap=policy)
                store.save_schedule(request.definition(), mode="create", now=T0)
            samples, fired = [], []
            for second in range(1, passes + 2):
                now = T0 + timedelta(seconds=second)
                wall, cpu = time.perf_counter(), time.process_time()
                report = store.fire_due_schedules(schedules.prepare_tick, now=now, limit=count)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                assert report.started + report.dropped == count, report
                if second > 1:  # the first pass starts every policy's first tick alike
                    samples.append((wall, cpu))
                    fired.append(report.started)
            wall = statistics.median(s[0] for s in samples)
            cpu = statistics.median(s[1] for s in samples)
            rows.append(
                {
                    "schedules": count,
                    "policy": policy,
                    "started": statistics.median(fired),
                    "pass_ms": wall * 1000,
                    "wall_us": wall / count * 1e6,
                    "cpu_us": cpu / count * 1e6,
                }
            )
            note(f"{count} schedules, {policy}: {wall * 1000:.0f} ms a pass")
            for schedule_id in ids:
                store.delete_schedule(schedule_id)
    return rows


def one_backend(backend: str, counts: list[int], passes: int) -> None:
    if backend == "postgres":
        from bench.support import own_database

        database = own_database(DATABASE)
    else:
        database = sqlite_database()
    with database:
        rows = measure(counts, passes)
    print(json.dumps(rows))


def main() -> None:
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))  # a run's own, as bench/api_http.py
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--backends", nargs="+", default=["postgres", "sqlite"], choices=["postgres", "sqlite"])
    parser.add_argument("--one", choices=["postgres", "sqlite"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one_backend(args.one, args.counts, args.passes)
        return
    table = []
    for backend in args.backends:
        command = [sys.executable, __file__, "--one", backend, "--passes", str(args.passes), "--counts"]
        done = subprocess.run(command + [str(c) for c in args.counts], cwd=ROOT, capture_output=True, text=True)
        sys.stderr.write(done.stderr)
        if done.returncode:
            raise SystemExit(f"{backend}: exited with {done.returncode}")
        table += [{"database": backend, **row} for row in json.loads(done.stdout.strip().splitlines()[-1])]
    print(f"\nschedule ticks: one firing pass over N due schedules, median of {args.passes} passes")
    print(f"{'database':<10}{'N':>6}  {'policy':<10}{'started':>8}{'pass ms':>10}{'µs/tick':>10}{'CPU µs/tick':>13}")
    for row in table:
        print(
            f"{row['database']:<10}{row['schedules']:>6}  {row['policy']:<10}{row['started']:>8.0f}"
            f"{row['pass_ms']:>10.1f}{row['wall_us']:>10.0f}{row['cpu_us']:>13.0f}"
        )


if __name__ == "__main__":
    main()
