#!/usr/bin/env python
"""Claim latency and drain throughput with a million finished executions in the tables
(issue 13, item 3: "within 20 % of the empty-table figures").

On a database of its own (``obelisk_bench_bigtables_<checkout>_<pid>``, created and dropped), three times — on
fresh tables; after adding ``--rows`` (1,000,000) finished executions; and once more after
truncating the tables, so that the machine's drift during the run shows (the full-table
figures are compared with the mean of the two empty ones) — with one cluster of 2 worker
processes and the no-op activity (bench/components.py) it measures:

- drain: ``--drain`` (20,000) pending executions committed at once, executions/s from the
  first ``Locked`` to the last ``Finished`` event;
- submit → result: ``--latency`` (300) single executions back to back, p50 / p99 as seen by
  the client (like bench/run.py's latency), all samples of the repetitions pooled;
- the claim query alone: ``locking._due_candidates`` run under ``EXPLAIN (ANALYZE, BUFFERS)``
  with 1,000 due executions, rolled back (its execution time; the whole plan is printed for
  the full tables).

``--repeats`` (3) drains and latency runs per phase; the table shows their median. Each phase
starts with VACUUM ANALYZE, CHECKPOINT and ``sync``. Same-run baselines: pgbench (1-row
insert, 1 client, 3 s) at the start of each phase, and the load average. An "empty" phase
ends with only the executions it drained itself in the tables.

The million rows are written by SQL (``INSERT … SELECT generate_series``): each is a copy of
a real no-op execution the engine finished in the first phase — every ``t_state`` column, and
its three events (``created`` at version 0, ``locked`` at 1, ``finished`` at 2) with their
JSON text — with a new id ``E_<ULID>`` (the ULID's time is the row's ``created_at``, spread
over the 6 days before the run), a new run id, and times shifted accordingly; then
``VACUUM ANALYZE``. A few of them are read back through the store to check they parse.

Usage: python bench/bigtables.py [--rows 1000000] [--drain 20000] [--latency 300] [--repeats 3]
(about 6 minutes; the fill and its VACUUM take 1½ of them)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.run import FFQN, create_pending, latency_samples, percentile, pgbench  # noqa: E402
from bench.support import drain, load_average, note, own_database, running, warm_up  # noqa: E402

DATABASE = "obelisk_bench_bigtables"
WITHIN = 0.20  # full-table figures no more than 20 % worse than the empty-table ones
CLAIM_LIMIT = 128  # the executor's largest batch
PENDING_FOR_PLAN = 1000

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def base32(expression: str, chars: int) -> str:
    """SQL: the low ``5 * chars`` bits of a bigint expression as Crockford base32."""
    return " || ".join(
        f"substr('{CROCKFORD}', (({expression} >> {5 * (chars - 1 - k)}) & 31)::int + 1, 1)" for k in range(chars)
    )


def ulid(ms: str, r1: str, r2: str) -> str:
    """SQL: a ULID from bigint columns: ``ms`` (48 bits of milliseconds), ``r1`` and ``r2``
    (40 random bits each)."""
    return " || ".join([base32(ms, 10), base32(r1, 8), base32(r2, 8)])


def random_bits(text: str) -> str:
    """SQL: two columns ``r1``, ``r2`` of 40 bits each from md5(``text``)."""
    return ", ".join(f"('x' || substr(md5({text}), {at}, 10))::bit(40)::bigint AS r{n}" for n, at in ((1, 1), (2, 11)))


def iso(t: str) -> str:
    """SQL: a time as events.py writes it, 2026-12-04T00:52:48.062268Z."""
    return f"""to_char(({t}) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


MS = "floor(extract(epoch FROM {}) * 1000)::bigint"
SEED = "'e' || i"  # of the random part of a filled execution's id

# Columns that get new values; every other t_state column is copied from the real row.
TIMES = ("created_at", "first_scheduled_at", "pending_expires_finished", "updated_at")


def fill(rows: int) -> tuple[float, str]:
    """Add ``rows`` finished executions, copies of a real one; returns (seconds, sample id)."""
    from django.db import connection, transaction

    from executions.models import ExecutionEvent, ExecutionState

    real = ExecutionState.objects.filter(ffqn=FFQN, state="finished").order_by("-created_at").first()
    events = list(
        ExecutionEvent.objects.filter(execution_id=real.execution_id)
        .order_by("version")
        .values_list("version", "created_at", "variant", "join_set_id", "history_event_type", "consumes_response")
    )
    with connection.cursor() as cursor:  # the exact JSON text, not a re-serialisation
        cursor.execute(
            "SELECT json_value::text FROM t_execution_log WHERE execution_id = %s ORDER BY version",
            [real.execution_id],
        )
        texts = [text for (text,) in cursor.fetchall()]
    if [v for v, *_ in events] != [0, 1, 2]:
        raise SystemExit(f"expected a real execution with 3 events, got {events}")
    from executions import store

    log = store.get(real.execution_id)
    created, locked = log.events[0].event, log.events[1].event
    stamp = lambda t: t.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")  # noqa: E731
    templates = [
        texts[0].replace(stamp(created.scheduled_at), "@SCHED@"),
        texts[1].replace(locked.run_id, "@RUN@").replace(stamp(locked.lock_expires_at), "@EXPIRES@"),
        texts[2],
    ]
    if "@SCHED@" not in templates[0] or "@RUN@" not in templates[1] or "@EXPIRES@" not in templates[1]:
        raise SystemExit(f"could not find the times and run id in the real events: {texts}")
    offset = lambda t: t - real.created_at  # noqa: E731

    columns = [f.column for f in ExecutionState._meta.concrete_fields if f.column not in ("execution_id", *TIMES)]
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(days=7)
    step = timedelta(days=6) / rows
    fill_end = start + step * (rows + 2)
    started = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cursor:
        # (OFFSET 0 keeps each subquery's columns computed once per row)
        cursor.execute(
            f"INSERT INTO t_state (execution_id, {', '.join(TIMES)}, {', '.join(columns)})"
            f" SELECT 'E_' || {ulid('g.ms', 'g.r1', 'g.r2')}, "
            + ", ".join("g.c + %s" for _ in TIMES)
            + ", "
            + ", ".join(f"r.{c}" for c in columns)
            + f" FROM (SELECT i, c, {MS.format('c')} AS ms, {random_bits(SEED)} FROM"
            " (SELECT i, %s::timestamptz + i * %s::interval + (i %% 997 + 1) * interval '1 microsecond' AS c"
            "  FROM generate_series(1, %s) AS i) AS t OFFSET 0) AS g,"
            " (SELECT * FROM t_state WHERE execution_id = %s) AS r ORDER BY g.i",
            [*(offset(getattr(real, t)) for t in TIMES), start, step, rows, real.execution_id],
        )
        note(f"fill: {rows:,} rows in t_state after {time.perf_counter() - started:.0f} s")
        for (version, at, variant, join_set_id, history_type, consumes), template in zip(
            events, templates, strict=True
        ):
            cursor.execute(
                "INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, join_set_id,"
                " history_event_type, consumes_response)"
                " SELECT s.execution_id, %s, s.created_at + %s,"
                f" replace(replace(replace(%s, '@SCHED@', {iso('s.created_at + %s')}),"
                f"  '@EXPIRES@', {iso('s.created_at + %s')}), '@RUN@', 'Run_' || {ulid('s.ms', 's.r1', 's.r2')})::json,"
                " %s, %s, %s, %s"
                f" FROM (SELECT execution_id, created_at, {MS.format('created_at + %s')} AS ms, {random_bits('execution_id')}"
                "  FROM t_state WHERE created_at < %s OFFSET 0) AS s ORDER BY s.created_at",
                [
                    version, offset(at), template, offset(created.scheduled_at), offset(locked.lock_expires_at),
                    variant, join_set_id, history_type, consumes, offset(at), fill_end,
                ],
            )  # fmt: skip
            note(f"fill: {variant} events written after {time.perf_counter() - started:.0f} s")
        cursor.execute("SELECT execution_id FROM t_state WHERE created_at < %s ORDER BY created_at LIMIT 1", [fill_end])
        sample = cursor.fetchone()[0]
    note(f"fill: committed after {time.perf_counter() - started:.0f} s")
    connection.cursor().execute("VACUUM ANALYZE")
    return time.perf_counter() - started, sample


def check_rows(sample: str) -> None:
    """A filled execution reads back through the store like a real one."""
    from executions import store
    from executions.ids import ExecutionId, parse_run_id

    log = store.get(sample)
    ExecutionId.parse(sample)
    parse_run_id(log.events[1].event.run_id)
    assert [e.event.VARIANT for e in log.events] == ["created", "locked", "finished"], log.events
    assert store.get_finished_result(sample) is not None


def claim_plan() -> tuple[float, list[str]]:
    """``_due_candidates`` as the executor runs it, under EXPLAIN (ANALYZE, BUFFERS), with
    1,000 due executions; run twice (the second, warm, is kept), rolled back."""
    from django.db import connection, transaction
    from django.utils import timezone

    from executions import store
    from executions.store.locking import _due_candidates
    from workers.components import load_components

    spec = load_components()[FFQN]
    served = {FFQN: store.LockTerms(spec.component_id, spec.retry_config, spec.lock_duration)}

    def explain(execute, sql, params, many, context):
        return execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params, many, context)

    with transaction.atomic():
        create_pending(PENDING_FOR_PLAN)
    for _ in range(2):
        with transaction.atomic(), connection.execute_wrapper(explain):
            lines = [line for (line,) in _due_candidates(served, timezone.now(), CLAIM_LIMIT)]
            transaction.set_rollback(True)
    ms = next(float(line.split(":")[1].split()[0]) for line in lines if line.startswith("Execution Time"))
    return ms, lines


def table_sizes() -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM t_state), (SELECT count(*) FROM t_execution_log),"
            " pg_total_relation_size('t_state') + pg_total_relation_size('t_execution_log')"
        )
        states, events, size = cursor.fetchone()
    return {"states": states, "events": events, "mib": size / 2**20}


def phase(url: str, args) -> dict:
    """Every measure once on the tables as they are, after the same preparation: VACUUM
    ANALYZE, a checkpoint and the OS's dirty pages written (so the fill's writes are not
    still being written back while the full tables are measured)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
        cursor.execute("CHECKPOINT")
    os.sync()
    fig = {**table_sizes(), "load_start": load_average(), "pgbench": pgbench(url, 1, 3)["tps"]}
    fig["claim_ms"], fig["plan"] = claim_plan()
    drains, samples = [], []
    with running(url, workers=2) as clusters:
        warm_up(clusters)  # drains the executions claim_plan left pending, too
        latency_samples(20)
        for repeat in range(args.repeats):
            note(f"drain of {args.drain:,} and {args.latency} one-at-a-time executions, {repeat + 1}/{args.repeats}")
            drains.append(drain(clusters, args.drain)["exec_s"])
            samples.extend(latency_samples(args.latency))
    fig.update(
        drain=statistics.median(drains),
        drains=drains,
        p50=percentile(samples, 0.5),
        p99=percentile(samples, 0.99),
        load_end=load_average(),
    )
    return fig


def report(before: dict, full: dict, after: dict, args, fill_seconds: float) -> None:
    print(
        f"\nBig tables: one cluster of 2 worker processes, no-op activity; per phase {args.repeats} x (drain of "
        f"{args.drain:,}, then {args.latency} submit -> result), drain: median, p50/p99: all samples pooled\n"
        f"phases: empty tables, then {args.rows:,} finished executions added by SQL ({fill_seconds:.0f} s with "
        f"VACUUM ANALYZE), then the tables truncated and measured empty again; full / empty uses the mean of the "
        f"two empty phases"
    )
    rows = [
        ("t_state rows", "", "states", ",.0f", None),
        ("t_execution_log rows", "", "events", ",.0f", None),
        ("both tables, with indexes", "MiB", "mib", ",.0f", None),
        ("drain, 2 workers", "exec/s", "drain", ",.0f", "higher"),
        ("submit -> result p50", "ms", "p50", ".2f", "lower"),
        ("submit -> result p99", "ms", "p99", ".2f", "lower"),
        (f"claim query alone, {PENDING_FOR_PLAN:,} due", "ms", "claim_ms", ".3f", None),
        ("same run: pgbench, 1 client", "tx/s", "pgbench", ",.0f", None),
    ]
    header = (
        f"{'measure':<31} {'unit':<6} | {'empty':>8} | {'full':>9} | {'empty again':>11} | {'full/empty':>10} | "
        f"{'bar':<7} | verdict"
    )
    print(header + "\n" + "-" * len(header))
    for measure, unit, key, spec, better in rows:
        empty = (before[key] + after[key]) / 2
        ratio = full[key] / empty if empty else float("nan")
        bar = verdict = ""
        if better == "higher":
            bar, verdict = f">= {1 - WITHIN:.2f}", "meets" if ratio >= 1 - WITHIN else "MISSES"
        elif better == "lower":
            bar, verdict = f"<= {1 + WITHIN:.2f}", "meets" if ratio <= 1 + WITHIN else "MISSES"
        shown = f"{ratio:.2f}" if key not in ("states", "events", "mib") else ""
        print(
            f"{measure:<31} {unit:<6} | {format(before[key], spec):>8} | {format(full[key], spec):>9} | "
            f"{format(after[key], spec):>11} | {shown:>10} | {bar:<7} | {verdict}"
        )
    for name, fig in (("empty", before), ("full", full), ("empty again", after)):
        drains = ", ".join(f"{d:,.0f}" for d in fig["drains"])
        print(f"{name}: drains {drains} exec/s; load average {fig['load_start']} -> {fig['load_end']}")
    print(
        f"\nThe claim query on the full tables (locking._due_candidates, {PENDING_FOR_PLAN:,} due, LIMIT "
        f"{CLAIM_LIMIT}, second run):"
    )
    print("\n".join("  " + line for line in full["plan"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="finished executions added for the full phase")
    parser.add_argument("--drain", type=int, default=20_000)
    parser.add_argument("--latency", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with own_database(DATABASE) as url:
        note("phase 1: empty tables")
        empty = phase(url, args)
        note(f"filling the tables with {args.rows:,} finished executions")
        fill_seconds, sample = fill(args.rows)
        check_rows(sample)
        note("phase 2: full tables")
        full = phase(url, args)
        note("phase 3: the tables truncated, empty again")
        from django.db import connection

        connection.cursor().execute("TRUNCATE t_state CASCADE")  # and every table that references it
        after = phase(url, args)
    report(empty, full, after, args, fill_seconds)


if __name__ == "__main__":
    main()
