#!/usr/bin/env python
"""Scale-out: drain throughput against worker processes and clusters (issue 13, item 4).

On a database of its own (``obelisk_bench_scaling_<checkout>_<pid>``, created and dropped), for each
configuration C×W of ``--configs`` (C clusters of W worker processes, all on this machine
and one PostgreSQL; default 1, 2, 4 and 8 processes as 1, 2 or 4 clusters) it starts the
clusters, warms them up, drains ``--drain`` (20,000) pending no-op executions committed at
once, and stops them. Per drain: executions/s and events/s (3 events each) from the first
``Locked`` to the last ``Finished`` event; what one execution cost the database — writing
transactions (transaction ids taken), WAL bytes and CPU ms of the PostgreSQL server's
processes — and CPU ms of the worker clusters. Those server-wide counters include whatever
else ran on the server meanwhile.

Same-run baseline: pgbench (one-row insert transactions) with 1, 2, 4 and 8 clients, before
the drains and again after them; each drain is shown next to pgbench with as many clients
as it has worker processes (the mean of the two runs), and the load average.

Usage: python bench/scaling.py [--drain 20000] [--configs 1x1 1x2 2x1 1x4 2x2 4x1 2x4 4x2]
(about 5 minutes)
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import pgbench  # noqa: E402
from bench.support import drain, load_average, note, own_database, running, warm_up  # noqa: E402

DATABASE = "obelisk_bench_scaling"
CONFIGS = ["1x1", "1x2", "2x1", "1x4", "2x2", "4x1", "2x4", "4x2"]
PGBENCH_CLIENTS = (1, 2, 4, 8)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drain", type=int, default=20_000, help="executions in each drain")
    parser.add_argument("--configs", nargs="+", default=CONFIGS, metavar="CxW", help="C clusters of W workers")
    parser.add_argument("--pgbench-seconds", type=int, default=5)
    args = parser.parse_args()

    results = []
    load_start = load_average()
    with own_database(DATABASE) as url:
        note("pgbench")
        before = {c: pgbench(url, c, args.pgbench_seconds)["tps"] for c in PGBENCH_CLIENTS}
        for spec in args.configs:
            count, workers = (int(part) for part in spec.lower().split("x"))
            note(f"{count} cluster(s) x {workers} worker(s): drain of {args.drain:,}")
            load = load_average()
            with running(url, workers, count) as clusters:
                warm_up(clusters)
                results.append((count, workers, load, drain(clusters, args.drain)))
        note("pgbench again")
        after = {c: pgbench(url, c, args.pgbench_seconds)["tps"] for c in PGBENCH_CLIENTS}

    print(
        f"\nScale-out: drain of {args.drain:,} no-op executions per configuration, all clusters on this machine "
        f"({os.cpu_count()} CPUs) and one PostgreSQL 15 on it; load average {load_start} at start, "
        f"{load_average()} at end"
    )
    print(
        "same run: pgbench 1-row insert, tx/s with 1 / 2 / 4 / 8 clients: "
        + " / ".join(f"{before[c]:,.0f}" for c in PGBENCH_CLIENTS)
        + " before the drains, "
        + " / ".join(f"{after[c]:,.0f}" for c in PGBENCH_CLIENTS)
        + " after"
    )
    header = (
        f"{'clusters x workers':<18} | {'procs':>5} | {'exec/s':>6} | {'events/s':>8} | {'pgbench':>7} | "
        f"{'exec/tx':>7} | {'write tx/exec':>13} | {'WAL B/exec':>13} | {'PG CPU ms/exec':>14} | "
        f"{'cluster CPU ms/exec':>19} | load average at start"
    )
    print(header + "\n" + "-" * len(header))
    for count, workers, load, fig in results:
        procs = count * workers
        clients = max(c for c in PGBENCH_CLIENTS if c <= procs)
        base = (before[clients] + after[clients]) / 2
        wal = f"{fig['create_wal_per_exec']:,.0f}+{fig['wal_per_exec']:,.0f}"
        cpu = f"{fig['create_pg_cpu_ms']:.3f}+{fig['pg_cpu_ms']:.3f}"
        print(
            f"{f'{count} x {workers}':<18} | {procs:>5} | {fig['exec_s']:>6,.0f} | {fig['events_s']:>8,.0f} | "
            f"{base:>7,.0f} | {fig['exec_s'] / base:>7.2f} | {fig['write_tx_per_exec']:>13.3f} | {wal:>13} | "
            f"{cpu:>14} | {fig['cluster_cpu_ms']:>19.3f} | {load}"
        )
    legend = (
        "(exec/s: first Locked -> last Finished event, 3 events per execution; pgbench: tx/s with as many clients as "
        "worker processes, mean of the runs before and after; exec/tx = exec/s / pgbench; write tx (transaction ids "
        "taken), WAL and PG CPU are server-wide: over the drain (claims and results, from the pending rows' commit "
        "to the poll that saw none left), WAL and PG CPU also of creating the pending rows, shown as create+drain)"
    )
    print(textwrap.fill(legend, width=len(header), break_on_hyphens=False))


if __name__ == "__main__":
    main()
