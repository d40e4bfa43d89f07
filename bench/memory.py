#!/usr/bin/env python
"""A worker's memory over many executions (issue 13, item 3: "a worker's RSS after 200,000
executions is within 10 % of its RSS after 10,000").

One cluster with one worker process (``manage.py obelisk_worker --workers 1``), on a
database of its own (``obelisk_bench_memory_<checkout>_<pid>``, created and dropped), drains no-op
executions (bench/components.py) in chunks of ``--chunk``: each chunk is created pending in
one transaction (``bench.run.create_pending``), then drained. After each chunk, with the
cluster idle, it samples the resident memory (VmRSS) of the cluster's processes: the worker
process (the child of django-q2's sentinel that used the most CPU; its unshared part, USS =
private clean + dirty pages, too), the largest process and the sum. It prints the samples at
10,000, a few points between and ``--total``, next to the drain rate of each chunk, the load
average and a same-run pgbench, and the ratio RSS(total) ÷ RSS(first chunk).

Usage: python bench/memory.py [--total 200000] [--chunk 10000]   (about 2 minutes per 200,000)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import cpu_seconds, pgbench, process_tree, rss_mib  # noqa: E402
from bench.support import load_average, note, own_database, running, wait_drained, warm_up  # noqa: E402

DATABASE = "obelisk_bench_memory"
BAR = 1.10  # RSS after --total within 10 % of RSS after the first chunk


def parent_of(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[1])


def worker_pid(root: int) -> int:
    """The sentinel's child that used the most CPU: the worker (not the pusher or monitor)."""
    tree = process_tree(root)
    sentinels = [pid for pid in tree if pid != root and parent_of(pid) == root]
    children = [pid for pid in tree if pid not in sentinels and pid != root and parent_of(pid) in sentinels]
    return max(children, key=lambda pid: cpu_seconds([pid], -1))


def uss_mib(pid: int) -> float:
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
    return (int(fields["Private_Clean"].split()[0]) + int(fields["Private_Dirty"].split()[0])) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--total", type=int, default=200_000, help="executions drained in all")
    parser.add_argument("--chunk", type=int, default=10_000, help="executions per chunk (the first sample)")
    args = parser.parse_args()
    from django.db import transaction

    from bench.run import create_pending

    rows, load_start = [], load_average()
    with own_database(DATABASE) as url:
        base = pgbench(url, 1, 3)
        with running(url, workers=1) as clusters:
            warm_up(clusters)
            root, worker, done = clusters.processes[0].pid, None, 0
            while done < args.total:
                count = min(args.chunk, args.total - done)
                with transaction.atomic():
                    create_pending(count)
                started = time.perf_counter()
                wait_drained(clusters)
                rate = count / (time.perf_counter() - started)
                done += count
                time.sleep(0.5)  # idle again: lingering claims over, results written
                now_worker = worker_pid(root)
                if worker is not None and now_worker != worker:
                    note(f"the worker process changed ({worker} -> {now_worker}): restarted or recycled")
                worker = now_worker
                total, largest = rss_mib(process_tree(root))
                worker_rss, _ = rss_mib([worker])
                rows.append((done, worker_rss, uss_mib(worker), largest, total, rate, load_average()))
                note(f"{done:,}: worker RSS {worker_rss:.1f} MiB, sum {total:.0f} MiB, {rate:,.0f} exec/s")

    first = rows[0]
    shown = [r for r in rows if r[0] in (first[0], 2 * first[0]) or r[0] % (5 * args.chunk) == 0 or r is rows[-1]]
    print(
        f"\nWorker memory: one cluster of 1 worker process, no-op activity, {args.total:,} executions in chunks "
        f"of {args.chunk:,}\nsame run: pgbench 1-row insert, 1 client: {base['tps']:,.0f} tx/s; "
        f"load average {load_start} at start, {load_average()} at end"
    )
    header = f"{'executions':>10} | {'worker RSS':>10} | {'worker USS':>10} | {'largest':>7} | {'sum':>5} | "
    header += f"{'chunk drain':>11} | load average"
    print(header + "\n" + "-" * len(header))
    for done, worker_rss, uss, largest, total, rate, load in shown:
        print(
            f"{done:>10,} | {worker_rss:>6.1f} MiB | {uss:>6.1f} MiB | {largest:>3.0f} MiB | {total:>5.0f} | "
            f"{rate:>6,.0f} /s  | {load}"
        )
    last = rows[-1]
    ratio = last[1] / first[1]
    print(
        f"worker RSS after {last[0]:,} / after {first[0]:,}: {ratio:.3f} (USS {last[2] / first[2]:.3f}, "
        f"largest {last[3] / first[3]:.3f}, sum {last[4] / first[4]:.3f}); bar <= {BAR:.2f}: "
        f"{'meets' if ratio <= BAR else 'MISSES'}"
    )
    print("(RSS counts pages shared with the forked siblings in each process; USS only its own; MiB; sum in MiB)")


if __name__ == "__main__":
    main()
