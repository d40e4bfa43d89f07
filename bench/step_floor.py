#!/usr/bin/env python
"""What the database alone asks of a workflow step and of a one-step workflow, next to DBOS (issue 40).

Usage: python bench/step_floor.py [--database-url URL] [--n 800] [--one-step 200] [--rounds 3] [--no-dbos]

A floor, not the engine: one Python process sends, through psycopg with no engine code at
all, the rows a ``ctx.call`` of a local child writes on this engine's real schema (its own
database ``obelisk_step_floor_<checkout>_<pid>``, migrated, dropped afterwards, D106), N
steps in a row, on one connection, each statement its own transaction as the engine sends
them. Three ways, interleaved over ``--rounds`` rounds:

- **two commits** (the engine today, D126 and D70): the parent's call (its row to
  ``blocked_by_join_set``, three history events, the child's row created locked with its
  ``Created`` and ``Locked``), then the child's result (its row to ``finished``, its
  ``Finished``, the response to the parent, the parent's row to pending);
- **one commit** (D127's fold, the fewest writes a child execution with its own history
  allows): the child's result and the parent's next call in one statement, the parent's
  row written once;
- **one insert**: a single one-row insert per step, what a DBOS step checkpoints (its
  ``operation_outputs`` row), the commit's own floor.

Then **one step through a worker process**, ``--one-step`` workflows per round: a client
process submits a workflow (its row and ``Created``, announced on a channel of this
script's own) and waits for its announced result; a worker process, woken by the
announcement, claims it (``FOR UPDATE SKIP LOCKED``, its ``Locked``), calls its one child
(created locked) and writes the child's result with the workflow's ``Finished``: the four
commits and two hand-offs a design whose workers claim submitted work cannot go below,
even with D127's fold. p50 of each round.

DBOS's whole step and its one-step workflow (``../shared/baselines/dbos/workflows.py`` and
``bench/dbos_one_step.py``, as bench/workflows.py runs them) are measured in the same run.
What is left of half DBOS's figure once the floor is paid is the budget for everything an
engine's Python does (replay, the activity's call, building the statements, reading their
answers); a negative one is a target beneath the floor.

Each figure: wall ms per step (median of the rounds, min and max beside it) and this
process's CPU per step (psycopg's encoding and the wait's system calls).

why: D134
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.support import ADMIN_URL, note, own_database  # noqa: E402

DIGEST = "sha256:" + "ab" * 32
DEPLOYMENT = "Dep_01KBZ000000000000000000000"
EXECUTOR = "Exr_01KBZ000000000000000000000"
RUN = "Run_01KBZ000000000000000000000"
PARENT = "E_01KBZ000000000000000000000"
CHILD_FFQN = "bench:wf/ifc.noop"

# A step's rows, as JSON documents of the sizes the engine's events have (about 150-450
# bytes; what matters to the server is their number, their indexes and the commit).
STATE_COLUMNS = (
    "execution_id text, is_top_level boolean, corresponding_version bigint, ffqn text, created_at timestamptz, "
    "component_id_input_digest text, component_type text, first_scheduled_at timestamptz, deployment_id text, "
    "pending_expires_finished timestamptz, state text, updated_at timestamptz, intermittent_event_count integer, "
    "max_retries bigint, retry_exp_backoff_millis bigint, last_lock_version bigint, executor_id text, run_id text, "
    "lock_generation bigint, lifecycle text"
)
LOG_COLUMNS = (
    "execution_id text, version bigint, created_at timestamptz, json_value json, variant text, join_set_id text, "
    "history_event_type text, consumes_response boolean"
)


def _inserts_of_a_call(guard: str = "") -> str:
    """The call's inserts as CTEs: the child's row (created locked) and the call's events,
    from their JSON documents; ``guard``, a condition both wait on."""
    where = f" WHERE {guard}" if guard else ""
    return f"""
c AS (
    INSERT INTO t_state (execution_id, is_top_level, corresponding_version, ffqn, created_at,
        component_id_input_digest, component_type, first_scheduled_at, deployment_id, pending_expires_finished,
        state, updated_at, intermittent_event_count, max_retries, retry_exp_backoff_millis, last_lock_version,
        executor_id, run_id, lock_generation, lifecycle)
    SELECT r.* FROM json_to_recordset(%(child_row)s) AS r({STATE_COLUMNS}){where}
),
l AS (
    INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, join_set_id,
        history_event_type, consumes_response)
    SELECT r.* FROM json_to_recordset(%(call_events)s) AS r({LOG_COLUMNS}){where}
)"""


_CALL = f"""
u AS (
    UPDATE t_state SET state = 'blocked_by_join_set', join_set_id = %(js)s, join_set_closing = false, last_lock_version = NULL,
        corresponding_version = %(parent_version)s, updated_at = %(now)s
    WHERE execution_id = %(parent)s AND run_id = %(run)s
    RETURNING 1
),{_inserts_of_a_call()}"""

_RESULT = f"""
f AS (
    UPDATE t_state SET state = 'finished', corresponding_version = 2, pending_expires_finished = %(now)s,
        updated_at = %(now)s, result_kind = 'ok', executor_id = NULL, run_id = NULL, last_lock_version = NULL
    WHERE execution_id = %(done)s AND run_id = %(run)s
    RETURNING 1
),
fl AS (
    INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, join_set_id,
        history_event_type, consumes_response)
    SELECT * FROM json_to_recordset(%(done_events)s) AS r({LOG_COLUMNS})
),
r AS (
    INSERT INTO t_join_set_response (created_at, execution_id, join_set_id, child_execution_id, finished_version, seq)
    SELECT %(now)s::timestamptz, %(parent)s::text, %(done_js)s::text, %(done)s::text, 2,
        (SELECT COALESCE(MAX(seq), 0) + 1 FROM t_join_set_response WHERE execution_id = %(parent)s::text)
)"""

TWO_COMMITS_CALL = f"WITH {_CALL}\nSELECT (SELECT count(*) FROM u)"
TWO_COMMITS_RESULT = f"""WITH {_RESULT},
p AS (
    UPDATE t_state SET state = 'pending_at', join_set_id = NULL, join_set_closing = NULL, updated_at = %(now)s
    WHERE execution_id = %(parent)s
    RETURNING 1
)
SELECT (SELECT count(*) FROM f) + (SELECT count(*) FROM p)"""
ONE_COMMIT = f"WITH {_RESULT},{_CALL}\nSELECT (SELECT count(*) FROM f) + (SELECT count(*) FROM u)"
ONE_INSERT = "INSERT INTO floor_step_output (workflow_id, function_id, output) VALUES (%s, %s, %s)"


def _event(execution_id: str, version: int, now: str, variant: str, size: int, **more) -> dict:
    """A log row whose JSON is about ``size`` bytes."""
    body = {"type": variant, "at": now, "pad": "x" * max(0, size - 60)}
    return {
        "execution_id": execution_id, "version": version, "created_at": now, "json_value": body,
        "variant": variant, "join_set_id": more.get("join_set_id"),
        "history_event_type": more.get("history_event_type"), "consumes_response": more.get("consumes", False),
    }  # fmt: skip


class Steps:
    """The rows of step ``i`` of the sequential workflow, and the versions they take."""

    def __init__(self, parent: str = PARENT) -> None:
        self.parent = parent
        self.lock_expiry = (datetime.now(UTC) + timedelta(hours=1)).isoformat()

    def child(self, i: int) -> str:
        return f"{self.parent}.{i}"

    def join_set(self, i: int) -> str:
        return f"o:{i}"

    def call(self, i: int, now: str) -> dict:
        """The parent's call of child ``i``: three history events, the child created locked."""
        child, js, version = self.child(i), self.join_set(i), 2 + 3 * i
        row = {
            "execution_id": child, "is_top_level": False, "corresponding_version": 1, "ffqn": CHILD_FFQN,
            "created_at": now, "component_id_input_digest": DIGEST, "component_type": "activity",
            "first_scheduled_at": now, "deployment_id": DEPLOYMENT, "pending_expires_finished": self.lock_expiry,
            "state": "locked", "updated_at": now, "intermittent_event_count": 0, "max_retries": 4,
            "retry_exp_backoff_millis": 100, "last_lock_version": 1, "executor_id": EXECUTOR, "run_id": RUN,
            "lock_generation": 1, "lifecycle": "active",
        }  # fmt: skip
        events = [
            _event(self.parent, version, now, "history_event", 150, join_set_id=js, history_event_type="join_set_create"),
            _event(self.parent, version + 1, now, "history_event", 300, join_set_id=js, history_event_type="join_set_request"),
            _event(self.parent, version + 2, now, "history_event", 150, join_set_id=js, history_event_type="join_next",
                   consumes=True),
            _event(child, 0, now, "created", 450),
            _event(child, 1, now, "locked", 250),
        ]  # fmt: skip
        return {
            "js": js, "parent_version": version + 3, "now": now, "parent": self.parent, "run": RUN,
            "child_row": json.dumps([row]), "call_events": json.dumps(events),
        }  # fmt: skip

    def result(self, i: int, now: str) -> dict:
        """Child ``i``'s result: its ``Finished``, the response to the parent."""
        return {
            "done": self.child(i), "done_js": self.join_set(i), "now": now, "parent": self.parent, "run": RUN,
            "done_events": json.dumps([_event(self.child(i), 2, now, "finished", 120)]),
        }  # fmt: skip


def prepare(conn) -> None:
    """The parent's row, locked by the run, and DBOS's one-row table."""
    now = datetime.now(UTC).isoformat()
    conn.execute("CREATE TABLE IF NOT EXISTS floor_step_output (workflow_id text, function_id int, output text, "
                 "PRIMARY KEY (workflow_id, function_id))")  # fmt: skip
    conn.execute(
        """INSERT INTO t_state (execution_id, is_top_level, corresponding_version, ffqn, created_at,
            component_id_input_digest, component_type, first_scheduled_at, deployment_id, pending_expires_finished,
            state, updated_at, intermittent_event_count, last_lock_version, executor_id, run_id, lock_generation,
            lifecycle)
        VALUES (%s, true, 1, 'bench:wf/ifc.sequential', %s, %s, 'workflow', %s, %s, %s, 'locked', %s, 0, 1, %s, %s,
            1, 'active')""",
        [PARENT, now, DIGEST, now, DEPLOYMENT, Steps().lock_expiry, now, EXECUTOR, RUN],
    )


def reset(conn) -> None:
    """Back to the parent alone, locked, before each way's N steps."""
    conn.execute("DELETE FROM t_join_set_response")
    conn.execute("DELETE FROM t_execution_log")
    conn.execute("DELETE FROM t_state WHERE execution_id <> %s", [PARENT])
    conn.execute("DELETE FROM floor_step_output")
    conn.execute(
        "UPDATE t_state SET state = 'locked', join_set_id = NULL, join_set_closing = NULL, last_lock_version = 1 "
        "WHERE execution_id = %s",
        [PARENT],
    )
    conn.execute("VACUUM ANALYZE")
    conn.execute("CHECKPOINT")


def _checked(conn, sql: str, params: dict, expected: int) -> None:
    got = conn.execute(sql, params, prepare=True).fetchone()[0]
    if got != expected:
        raise SystemExit(f"a floor statement wrote {got} rows where {expected} were meant: the schema moved")


def two_commits(conn, steps: Steps, n: int) -> None:
    for i in range(n):
        now = datetime.now(UTC).isoformat()
        _checked(conn, TWO_COMMITS_CALL, steps.call(i, now), 1)
        _checked(conn, TWO_COMMITS_RESULT, steps.result(i, now), 2)


def one_commit(conn, steps: Steps, n: int) -> None:
    now = datetime.now(UTC).isoformat()
    _checked(conn, TWO_COMMITS_CALL, steps.call(0, now), 1)  # the first call has no result before it
    for i in range(1, n + 1):
        now = datetime.now(UTC).isoformat()
        _checked(conn, ONE_COMMIT, {**steps.result(i - 1, now), **steps.call(i, now)}, 2)


def one_insert(conn, steps: Steps, n: int) -> None:
    for i in range(n):
        conn.execute(ONE_INSERT, [PARENT, i, json.dumps({"value": None})], prepare=True)


WAYS = {
    "two commits (today)": two_commits,
    "one commit (D127's fold)": one_commit,
    "one insert (DBOS's write)": one_insert,
}


# -- one step, submit -> result, through a worker process --------------------------------
# The fewest commits this design allows a one-step workflow once D127's fold is in: the
# client's submit (the row and its ``Created``, announced), the worker's claim (SKIP
# LOCKED, its ``Locked``), the call (the child created locked), and the child's result
# with the workflow's ``Finished`` (announced); then the client reads the result.

WORKFLOW_FFQN = "bench:wf/ifc.one-step"
SUBMIT = f"""
WITH c AS (
    INSERT INTO t_state (execution_id, is_top_level, corresponding_version, ffqn, created_at,
        component_id_input_digest, component_type, first_scheduled_at, deployment_id, pending_expires_finished,
        state, updated_at, intermittent_event_count, lock_generation, lifecycle)
    VALUES (%(id)s, true, 0, '{WORKFLOW_FFQN}', %(now)s, '{DIGEST}', 'workflow', %(now)s, '{DEPLOYMENT}',
        %(now)s, 'pending_at', %(now)s, 0, 0, 'active')
),
l AS (
    INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, consumes_response)
    VALUES (%(id)s, 0, %(now)s, %(created)s, 'created', false)
)
SELECT pg_notify('obelisk_floor_pending', %(id)s)"""
CLAIM = f"""
WITH p AS (
    SELECT execution_id FROM t_state
    WHERE state = 'pending_at' AND lifecycle = 'active' AND ffqn = '{WORKFLOW_FFQN}' AND pending_expires_finished <= %(now)s
    ORDER BY pending_expires_finished LIMIT 1 FOR UPDATE SKIP LOCKED
),
u AS (
    UPDATE t_state s SET state = 'locked', corresponding_version = 1, executor_id = '{EXECUTOR}', run_id = '{RUN}',
        last_lock_version = 1, lock_generation = s.lock_generation + 1, pending_expires_finished = %(expiry)s,
        updated_at = %(now)s
    FROM p WHERE s.execution_id = p.execution_id
    RETURNING s.execution_id
),
l AS (
    INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, consumes_response)
    SELECT u.execution_id, 1, %(now)s, %(locked)s, 'locked', false FROM u
)
SELECT execution_id FROM u"""
# The workflow locked and its call written in one statement (three commits in all): the
# worker runs the workflow's code up to its first call before it holds the row (code
# without effects, replayed anyway), and the claim is the call's write, refused when
# another worker has the row. Fewer commits than a claim that must come first allow.
CLAIM_AND_CALL = f"""
WITH p AS (
    SELECT execution_id FROM t_state
    WHERE execution_id = %(parent)s AND state = 'pending_at' AND lifecycle = 'active'
    FOR UPDATE SKIP LOCKED
),
u AS (
    UPDATE t_state s SET state = 'blocked_by_join_set', join_set_id = %(js)s, join_set_closing = false,
        corresponding_version = %(parent_version)s, executor_id = '{EXECUTOR}', run_id = %(run)s,
        lock_generation = s.lock_generation + 1, pending_expires_finished = %(expiry)s, updated_at = %(now)s
    FROM p WHERE s.execution_id = p.execution_id
    RETURNING s.execution_id
),{_inserts_of_a_call("EXISTS (SELECT FROM u)")}
SELECT count(*) FROM u"""
RESULT_AND_FINISH = f"""WITH {_RESULT},
pf AS (
    UPDATE t_state SET state = 'finished', result_kind = 'ok', corresponding_version = 5, executor_id = NULL,
        run_id = NULL, last_lock_version = NULL, join_set_id = NULL, join_set_closing = NULL,
        pending_expires_finished = %(now)s, updated_at = %(now)s
    WHERE execution_id = %(parent)s AND run_id = %(run)s
    RETURNING 1
),
pl AS (
    INSERT INTO t_execution_log (execution_id, version, created_at, json_value, variant, consumes_response)
    VALUES (%(parent)s, 5, %(now)s, %(finished)s, 'finished', false)
)
SELECT (SELECT count(*) FROM f) + (SELECT count(*) FROM pf), pg_notify('obelisk_floor_finished', %(parent)s)"""


def floor_worker(url: str, count: int, optimistic: bool) -> None:
    """The worker's side: at each announcement, claim the workflow announced, call its
    one child, and write the child's result with the workflow's ``Finished``; the claim a
    statement of its own, or (``optimistic``) the call's write."""
    import psycopg

    # Two sessions, as the engine's workers have: one listens (its generator holds the
    # connection while it waits), the other writes.
    with psycopg.connect(url, autocommit=True) as listening, psycopg.connect(url, autocommit=True) as conn:
        listening.execute("LISTEN obelisk_floor_pending")
        conn.execute("SELECT pg_notify('obelisk_floor_ready', '')")
        finished = 0
        for notice in listening.notifies(timeout=120):  # ends when the client is gone
            now = datetime.now(UTC)
            steps, stamp, expiry = Steps(notice.payload), now.isoformat(), (now + timedelta(seconds=30)).isoformat()
            locked = _event(notice.payload, 1, stamp, "locked", 250)
            if optimistic:
                call = steps.call(0, stamp)
                call["call_events"] = json.dumps([locked, *json.loads(call["call_events"])])
                _checked(conn, CLAIM_AND_CALL, {**call, "expiry": expiry}, 1)
            else:
                claim = {"now": now, "expiry": expiry, "locked": json.dumps(locked["json_value"])}
                if conn.execute(CLAIM, claim, prepare=True).fetchone() != (notice.payload,):
                    raise SystemExit("the one-step floor's claim did not find the workflow announced")
                _checked(conn, TWO_COMMITS_CALL, steps.call(0, stamp), 1)
            done = json.dumps(_event(notice.payload, 5, stamp, "finished", 120)["json_value"])
            _checked(conn, RESULT_AND_FINISH, {**steps.result(0, stamp), "finished": done}, 2)
            finished += 1
            if finished >= count:
                return


def one_step(url: str, count: int, optimistic: bool) -> list[float]:
    """Submit -> result of ``count`` one-step workflows, one after another: ms each."""
    import multiprocessing

    import psycopg

    warm = 20
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("LISTEN obelisk_floor_finished")
        conn.execute("LISTEN obelisk_floor_ready")
        worker = multiprocessing.get_context("spawn").Process(target=floor_worker, args=(url, count + warm, optimistic))
        worker.start()
        try:
            return _submit_and_wait(conn, count, warm)
        finally:
            worker.terminate()
            worker.join(timeout=10)


def _submit_and_wait(conn, count: int, warm: int) -> list[float]:
    """The client's side of ``one_step``: the ms of each workflow after the first ``warm``."""
    next(conn.notifies(timeout=60, stop_after=1))  # the worker listens
    samples = []
    for i in range(count + warm):
        execution_id = f"E_FLOOR{time.time_ns()}"
        started = time.perf_counter()
        now = datetime.now(UTC).isoformat()
        created = json.dumps(_event(execution_id, 0, now, "created", 450)["json_value"])
        conn.execute(SUBMIT, {"id": execution_id, "now": now, "created": created}, prepare=True)
        for notice in conn.notifies(timeout=30):
            if notice.payload == execution_id:
                break
        else:
            raise SystemExit("the one-step floor's worker did not answer within 30 s")
        row = conn.execute("SELECT state, result_kind FROM t_state WHERE execution_id = %s", [execution_id]).fetchone()
        if row != ("finished", "ok"):
            raise SystemExit(f"the one-step floor's workflow ended as {row}")
        if i >= warm:
            samples.append((time.perf_counter() - started) * 1000)
    return samples


def measure(url: str, n: int, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """Each way's (wall ms, CPU ms) per step, one entry per round; the ways interleaved."""
    import psycopg

    results: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    with psycopg.connect(url, autocommit=True) as conn:
        prepare(conn)
        for round_ in range(rounds):
            for way, run in WAYS.items():
                reset(conn)
                run(conn, Steps(), 20)  # warm: the statements prepared, the plan cached
                reset(conn)
                note(f"round {round_ + 1}/{rounds}: {way}, N={n}")
                wall, cpu = time.perf_counter(), time.process_time()
                run(conn, Steps(), n)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                results[way].append((wall * 1000 / n, cpu * 1000 / n))
    return results


def dbos_figures(admin_url: str, n: int, one_step_count: int) -> dict:
    """DBOS's ms per step at N = ``n`` and its one-step p50, as bench/workflows.py runs
    them (empty: the baseline is not available)."""
    import bench.workflows as workflows

    figures = workflows.dbos_baseline(admin_url, [n], workflows.DBOS_DIR, one_step_count, note) or {}
    return {"step": figures.get("sequential", {}).get(n), "one_step_p50": (figures.get("one_step") or {}).get("p50")}


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


ONE_STEP_WAYS = {"claim, then call (four commits)": False, "claim is the call (three)": True}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default=ADMIN_URL)
    parser.add_argument("--n", type=int, default=800, help="steps per way and round")
    parser.add_argument("--one-step", type=int, default=200, help="one-step workflows per way and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-dbos", action="store_true", help="do not run the DBOS baseline")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SECRET_KEY", "bench-step-floor")
    with own_database("obelisk_step_floor", args.database_url) as url:
        results = measure(url, args.n, args.rounds)
        p50s: dict[str, list[float]] = {way: [] for way in ONE_STEP_WAYS}
        for round_ in range(args.rounds):
            for way, optimistic in ONE_STEP_WAYS.items():
                note(f"round {round_ + 1}/{args.rounds}: one step, {way}, {args.one_step} workflows")
                p50s[way].append(statistics.median(one_step(url, args.one_step, optimistic)))
    dbos = {} if args.no_dbos else dbos_figures(args.database_url, args.n, args.one_step)
    print_floor(args, results, p50s, dbos)


def print_floor(args, results: dict, p50s: dict, dbos: dict) -> None:
    print(f"\nA sequential step's writes, N={args.n}, {args.rounds} rounds (min / median / max)")
    print(f"{'way':<32} | {'wall ms/step':>20} | {'client CPU ms/step':>20}")
    for way, rows in results.items():
        print(f"{way:<32} | {spread([w for w, _ in rows]):>20} | {spread([c for _, c in rows]):>20}")
    if dbos.get("step") is not None:
        print(f"{'DBOS, its whole step':<32} | {dbos['step']:>20.2f} |")
    print(f"\nA one-step workflow through a worker process, submit -> result p50 (ms), {args.rounds} rounds")
    for way, values in p50s.items():
        print(f"{way:<32} | {spread(values):>20}")
    if dbos.get("one_step_p50") is not None:
        print(f"{'DBOS, its whole workflow':<32} | {dbos['one_step_p50']:>20.2f}")
    if dbos.get("step") is not None:
        fold = statistics.median(w for w, _ in results["one commit (D127's fold)"])
        print(
            f"\nhalf of DBOS's step: {dbos['step'] / 2:.2f} ms; left of it for an engine's Python once the fold's "
            f"writes are paid: {dbos['step'] / 2 - fold:.2f} ms per step"
        )
    if dbos.get("one_step_p50") is not None:
        fewest = min(statistics.median(values) for values in p50s.values())
        print(
            f"half of DBOS's one-step p50: {dbos['one_step_p50'] / 2:.2f} ms; left of it once the fewest commits and "
            f"hand-offs are paid: {dbos['one_step_p50'] / 2 - fewest:.2f} ms"
        )


if __name__ == "__main__":
    main()
