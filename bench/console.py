#!/usr/bin/env python
"""Every page of the operator console at 1,000,000 executions (issue 36, item 4: "under 1 s").

On a database of its own (``obelisk_console_bench_<checkout>_<pid>``, created, migrated and
dropped; ``bench.support.own_database``, D106) it:

1. makes real executions through the client and the store, as the console tests do
   (``tests/support/browser.py``): one of each finished kind (ok, an error value, a failure
   with a traceback after a failed attempt, a timeout, a workflow with a child), and the
   live ones, left as they are: ``--live`` pending, running, scheduled, paused executions
   and blocked workflows (a tenth of them each);
2. copies the finished ones by SQL (``INSERT … SELECT generate_series``) to ``--rows``
   (1,000,000) in all: every ``t_state`` column and every event with its JSON text, a new
   ``E_<ULID>`` id (a child's is its parent copy's id and its own suffix), times shifted
   so that the copies are spread evenly over the 6 days before the run — so the last hour
   holds about 1/144 of them, as on a server that ran steadily. The mix: 85 % ok, 3 %
   error values, 1.5 % failures, 0.5 % timeouts, 5 % workflows and 5 % their children.
   Then ``VACUUM ANALYZE``;
3. times each console page through Django's test client as a logged-in superuser: one
   warm-up request, then ``--repeats`` (3) timed ones; the table gives the median and the
   slowest in ms, the rows the page lists, its queries and its slowest query in ms.

Copies of a workflow have no ``t_join_set_response`` rows (the list and the dashboard never
read them; the execution pages timed are of real executions).

Usage: python bench/console.py [--rows 1000000] [--repeats 3] [--live 500]
(about 4 minutes on a 2-core machine: the fill and its VACUUM take most of them)
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bigtables import MS, ulid  # noqa: E402
from bench.support import note, own_database  # noqa: E402

LIMIT_MS = 1000
SPREAD = timedelta(days=6)
# Share of the copies (of --rows) per template; a workflow family is two rows per copy.
MIX = {"ok": 0.85, "error": 0.03, "failed": 0.015, "timed_out": 0.005, "workflow": 0.05}
NEEDLE = "needle-in-the-console"  # the text of one recent real failure, for a rare search


def make_templates() -> dict[str, list[str]]:
    """Real executions, through the client and the store: the finished ones to copy (a
    family: the root first, then its descendants) and the live ones."""
    from executions.events import Err, ExecutionFailure, Ok
    from tests.support import browser as support
    from tests.support import helpers

    helpers.deploy_components()
    workflow, child = support.workflow_with_child()
    return {
        "ok": [support.finished(support.ADD, [1, 2], Ok(3))],
        "error": [support.finished(support.ERROR_VALUE, ["E42"], Err({"code": "E42"}))],
        "failed": [support.failed_execution()],
        "timed_out": [support.finished(support.NOOP, [], ExecutionFailure("timed_out", "lock expired"))],
        "workflow": [workflow, child],
    }


def make_live(count: int) -> dict[str, str]:
    """``count`` unfinished executions, real, a fifth in each live state; one recent failure
    with a rare text. Returns a sample id of each."""
    from django.utils import timezone

    from executions import client, store
    from executions.events import ExecutionFailure, Finished
    from tests.support import browser as support
    from tests.support import helpers

    each = max(1, count // 5)
    sample = {}
    for _ in range(each):
        sample["pending"] = client.submit(support.NOOP, []).execution_id
        sample["scheduled"] = client.submit(
            support.NOOP, [], scheduled_at=timezone.now() + timedelta(hours=1)
        ).execution_id
        sample["running"] = support.running()
        paused = client.submit(support.NOOP, []).execution_id
        client.pause(paused)
        sample["paused"] = paused
        blocked = helpers.create_workflow()
        locked = support._lock(blocked)
        helpers.block_on_child(blocked, locked)
        sample["blocked"] = blocked
    needle = client.submit(support.FAILS, []).execution_id
    locked = support._lock(needle)
    store.append(
        needle, None, Finished(retval=ExecutionFailure("uncategorized", f"KeyError: {NEEDLE}")), fence=locked.fence
    )
    sample["needle"] = needle
    return sample


def fill_family(family: list[str], copies: int, seed: int, end: datetime) -> None:
    """``copies`` copies of a finished execution and its descendants (``family``, root
    first), created evenly over the ``SPREAD`` before ``end``: one INSERT per table and
    member, from a temporary table of the new roots' ids and times."""
    from django.db import connection

    root = family[0]
    start = end - SPREAD
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS fill")
        cursor.execute(
            "CREATE TEMP TABLE fill AS"
            f" SELECT 'E_' || {ulid('ms', 'r1', 'r2')} AS id, c FROM ("
            f"  SELECT c, {MS.format('c')} AS ms,"
            "   ('x' || substr(md5(%s || i), 1, 10))::bit(40)::bigint AS r1,"
            "   ('x' || substr(md5(%s || i), 11, 10))::bit(40)::bigint AS r2"
            "  FROM (SELECT i, %s::timestamptz + i * %s::interval AS c FROM generate_series(1, %s) AS i) AS t"
            "  OFFSET 0) AS g",
            [f"s{seed}_", f"s{seed}_", start, SPREAD / copies, copies],
        )
        columns = [
            c
            for (c,) in _rows(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 't_state'"
                " AND column_name NOT IN ('execution_id', 'created_at', 'first_scheduled_at',"
                " 'pending_expires_finished', 'updated_at')"
            )
        ]
        for member in family:
            suffix = member[len(root) :]
            cursor.execute(
                "INSERT INTO t_state (execution_id, created_at, first_scheduled_at, pending_expires_finished,"
                f" updated_at, {', '.join(columns)})"
                " SELECT f.id || %s, f.c + (m.created_at - r.created_at), f.c + (m.first_scheduled_at - r.created_at),"
                " f.c + (m.pending_expires_finished - r.created_at), f.c + (m.updated_at - r.created_at),"
                f" {', '.join('m.' + c for c in columns)}"
                " FROM fill AS f, t_state AS m, t_state AS r WHERE m.execution_id = %s AND r.execution_id = %s",
                [suffix, member, root],
            )
            cursor.execute(
                "INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, join_set_id,"
                " history_event_type, consumes_response)"
                " SELECT f.id || %s, e.version, f.c + (e.created_at - r.created_at), e.json_value, e.variant,"
                " e.join_set_id, e.history_event_type, e.consumes_response"
                " FROM fill AS f, t_execution_log AS e, t_state AS r WHERE e.execution_id = %s AND r.execution_id = %s",
                [suffix, member, root],
            )
        cursor.execute("DROP TABLE fill")


def fill(templates: dict[str, list[str]], rows: int) -> float:
    from django.db import connection, transaction

    started = time.perf_counter()
    end = datetime.now(UTC) - timedelta(minutes=1)
    for seed, (name, family) in enumerate(templates.items()):
        copies = int(rows * MIX[name])
        with transaction.atomic():
            fill_family(family, copies, seed, end)
        note(
            f"fill: {copies:,} copies of {name} ({len(family)} row(s) each) after {time.perf_counter() - started:.0f} s"
        )
    connection.cursor().execute("VACUUM ANALYZE")
    note(f"fill: vacuumed after {time.perf_counter() - started:.0f} s")
    return time.perf_counter() - started


def _rows(sql: str, params=()) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def pages(sample: dict[str, str], templates: dict[str, list[str]]) -> list[tuple[str, str]]:
    """(label, URL) of every console page timed."""
    from django.urls import reverse

    from executions.outcome import OUTCOMES
    from executions.state_machine import State

    base = reverse("admin:obelisk_executions_executionstate_changelist")
    ok = templates["ok"][0]
    workflow, child = templates["workflow"]
    deployment, component, ffqn = _rows(
        "SELECT deployment_id, component_id_input_digest, ffqn FROM t_state WHERE execution_id = %s", [ok]
    )[0]
    listed = [
        ("list", ""),
        ("list, page 2", "?p=2"),
        ("list, page 200 (the last counted)", "?p=200"),
        ("list, with children", "?top_level=all"),
        ("list, children only", "?top_level=children"),
        ("outcome failed (any)", "?outcome=failed"),
        *((f"outcome {o}", f"?outcome={o}") for o in OUTCOMES),
        *((f"state {s}", f"?state__exact={s}") for s in State),
        ("lifecycle paused", "?lifecycle__exact=paused"),
        *((f"created, last {w}", f"?created={w}") for w in ("15m", "1h", "1d", "7d")),
        *((f"finished, last {w}", f"?finished={w}") for w in ("15m", "1h", "1d", "7d")),
        ("failed, last hour (the card's link)", "?outcome=failed&finished=1h&top_level=all"),
        ("function", f"?ffqn={ffqn}"),
        ("function, none of them", "?ffqn=test:acts/basic.noop-not-run"),
        ("deployment", f"?deployment={deployment}"),
        ("component", f"?component={component}"),
        ("search: a whole id", f"?q={ok}"),
        ("search: a child's whole id", f"?q={child}"),
        ("search: part of an id", f"?q={ok[-8:]}"),
        ("search: a function", "?q=basic.add"),
        ("search: common error text", "?q=never works"),
        ("search: rare error text", f"?q={NEEDLE}"),
        ("search: nothing matches", "?q=zzz-nothing-zzz"),
        ("search + outcome failed", "?q=ValueError&outcome=failed"),
    ]
    change = "admin:obelisk_executions_executionstate_change"
    return [
        ("dashboard (admin index)", "/admin/"),
        *((label, base + query) for label, query in listed),
        ("execution page: ok", reverse(change, args=[ok])),
        ("execution page: failed", reverse(change, args=[templates["failed"][0]])),
        ("execution page: workflow", reverse(change, args=[workflow])),
        ("execution page: running", reverse(change, args=[sample["running"]])),
        ("deployment page", reverse("admin:obelisk_deployments_deployment_change", args=[deployment])),
    ]


def time_page(client, url: str, repeats: int, explain_over_ms: float | None = None) -> dict:
    from django.db import connection

    queries: list[float] = []
    slow: list[tuple[str, object, float]] = []

    def timed(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            queries.append(time.perf_counter() - started)
            if explain_over_ms is not None and queries[-1] * 1000 > explain_over_ms:
                slow.append((sql, params, queries[-1] * 1000))

    response = client.get(url)  # warm-up
    if response.status_code != 200:
        raise SystemExit(f"{url}: HTTP {response.status_code}\n{response.content[:2000].decode(errors='replace')}")
    samples = []
    for _ in range(repeats):
        queries.clear()
        with connection.execute_wrapper(timed):
            started = time.perf_counter()
            response = client.get(url)
            samples.append((time.perf_counter() - started) * 1000)
    for sql, params, ms in slow[: len(slow) // max(1, repeats)]:
        explain(sql, params, ms)
    body = response.content.decode()
    return {
        "median": statistics.median(samples),
        "max": max(samples),
        "rows": len(re.findall(r'class="obelisk-id"', body)),
        "queries": len(queries),
        "slowest_query": max(queries, default=0) * 1000,
        "capped": "obelisk-count-capped" in body,
    }


def explain(sql: str, params, ms: float) -> None:
    """Print a slow query's plan, as run (``--explain``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
    print(f"\n-- {ms:.0f} ms: {sql[:1500]}\n{plan}\n", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--live", type=int, default=500)
    parser.add_argument("--only", help="time only the pages whose label contains this")
    parser.add_argument("--explain", type=float, metavar="MS", help="print the plan of each query slower than MS")
    args = parser.parse_args()
    with own_database("obelisk_console_bench"):
        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.test.utils import setup_test_environment

        setup_test_environment()  # the test client's host, as in the tests
        note("making the real executions")
        templates = make_templates()
        sample = make_live(args.live)
        fill(templates, args.rows)
        (total,) = _rows("SELECT COUNT(*) FROM t_state")[0]
        note(f"{total:,} executions in t_state")
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
        client = Client()
        client.force_login(user)
        results = []
        for label, url in pages(sample, templates):
            if args.only and args.only not in label:
                continue
            result = time_page(client, url, args.repeats, args.explain)
            results.append((label, result))
            note(f"{label}: {result['median']:.0f} ms")
        print_table(results, total, args)


def print_table(results: list[tuple[str, dict]], total: int, args) -> None:
    print(f"\nConsole pages at {total:,} executions (median of {args.repeats} after a warm-up; ms)\n")
    print("| page | median ms | max ms | rows listed | queries | slowest query ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, r in results:
        rows = f"{r['rows']}" + (" (count: more than 10,000)" if r["capped"] else "")
        print(f"| {label} | {r['median']:.0f} | {r['max']:.0f} | {rows} | {r['queries']} | {r['slowest_query']:.0f} |")
    slowest = max(r["max"] for _, r in results)
    verdict = "every page under 1 s" if slowest < LIMIT_MS else f"SLOWER THAN {LIMIT_MS} ms"
    print(f"\nslowest page (max of its runs): {slowest:.0f} ms: {verdict}")


if __name__ == "__main__":
    main()
