"""Prepared statements and their plans on PostgreSQL (decisions D71, D75, D76, D84, D87).

A plain create in one prepared statement makes what the create's transaction makes; the
claims and results a worker repeats are prepared; a failing batch in a transaction changes
nothing; a claim finds due work through the partial index of pending rows; group commits
and claims find rows by key in plans made while the tables were small, however many rows
are locked; the store alone keeps the log and responses free of orphans without a foreign
key; listing by function prefix is a range of the function index.

why: D71, D75, D76, D84, D87
"""

from __future__ import annotations

import contextlib

import pytest
from django.db import connection, transaction
from django.utils.timezone import now as timezone_now

from executions import errors, notify, store
from executions.events import Finished, Ok, Unlocked
from executions.ids import ExecutionId
from executions.models import ExecutionEvent, ExecutionState
from tests.support.helpers import FFQN, create, lock
from tests.support.hot_path import (
    log_of,
    row_of,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.postgres_only
def test_a_plain_create_in_one_prepared_statement_makes_what_the_creates_transaction_makes():
    """D71: outside a transaction, a plain create is ONE statement (its writes are CTEs),
    which the connection prepares once it has run it a few times. It makes the same row,
    the same event and the same notification as the create's transaction (inside
    ``atomic``) makes of a twin execution."""
    from django.db import transaction

    at = timezone_now()
    for _ in range(6):  # psycopg prepares a statement the fifth time a connection runs it
        create(FFQN, [1], now=at)
    with notify.Listener([notify.PENDING]) as listener, _statements_sent() as creating:
        in_one_statement = create(FFQN, [1], now=at)
        assert any(FFQN in note.items for note in listener.wait(5.0))
    (sql,) = creating
    assert sql.lstrip().startswith("WITH") and "; " not in sql
    assert _prepared_statement_count(sql) == 1
    with transaction.atomic():
        in_a_transaction = create(FFQN, [1], now=at)
    assert row_of(in_one_statement) == row_of(in_a_transaction)
    assert log_of(in_one_statement, from_version=0) == log_of(in_a_transaction, from_version=0)


@pytest.mark.postgres_only
def test_the_claims_and_results_a_worker_repeats_are_prepared_statements():
    """D71: the statements a worker runs for every batch (its claim of activities and its
    group commit of their results) are prepared on its connection after a few batches,
    so the server no longer parses and plans them."""
    from executions.ids import new_executor_id, new_run_id
    from tests.support.helpers import DEPLOYMENT, TERMS

    for _ in range(6):
        create(FFQN, [1])
        with _statements_sent() as running:
            (locked,) = store.lock_pending(
                {FFQN: TERMS}, limit=5, executor_id=new_executor_id(), run_id=new_run_id(), deployment_id=DEPLOYMENT
            )
            store.append_many([store.AppendItem(locked.execution_id, None, Finished(retval=Ok(1)), locked.fence)])
    claim, result = running
    assert _prepared_statement_count(claim) == 1
    assert _prepared_statement_count(result) == 1


@pytest.mark.postgres_only
@pytest.mark.parametrize("statements_after", [0, 1, 1000])
def test_a_batch_of_statements_in_a_transaction_that_fails_on_one_changes_nothing(statements_after, caplog):
    """D71: a transaction's statements go in one pipeline; when one of them fails (here a
    duplicate id), the caller gets Django's ``IntegrityError``, none of the batch's writes
    nor the rest of the transaction is kept, and nothing is logged (psycopg warns when a
    pipeline ends while an error of its own is on its way: a CLI printed that warning)."""
    from django.db import IntegrityError, transaction

    from executions.sql import Statements

    existing = create(FFQN, [1])
    before = ExecutionState.objects.count()
    with pytest.raises(IntegrityError), transaction.atomic():
        ExecutionState.store_objects.filter(pk=existing).update(ffqn="changed/in.tx")
        statements = Statements()
        statements.update(ExecutionState, [existing], {"max_retries": 7})
        statements.add(
            f"INSERT INTO {ExecutionState._meta.db_table} SELECT * FROM {ExecutionState._meta.db_table} "
            "WHERE execution_id = %s",
            [existing],
        )
        for _ in range(statements_after):
            statements.update(ExecutionState, [existing], {"max_retries": 8})
        statements.run()
    row = ExecutionState.objects.get(pk=existing)
    assert (row.ffqn, row.max_retries) == (FFQN, None)
    assert ExecutionState.objects.count() == before
    assert not [record for record in caplog.records if record.name.startswith("psycopg")]


@contextlib.contextmanager
def _statements_sent():
    """The text of each statement this connection sends meanwhile, as the store wrote it."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        yield sent


def _prepared_statement_count(sql: str) -> int:
    """How many prepared statements of this connection have the text ``sql`` (psycopg
    sends ``%s`` as ``$n``)."""
    import re

    counter = iter(range(1, 10_000))
    text = re.sub(r"%s", lambda _: f"${next(counter)}", sql)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s", [text])
        return cursor.fetchone()[0]


@pytest.mark.postgres_only
def test_a_claims_prepared_statement_finds_due_work_through_the_partial_index_of_pending_rows():
    """D71: a prepared statement runs a generic plan, and a generic plan cannot use a
    partial index whose predicate is a parameter. The claim's constant predicates (state
    pending, lifecycle active) are therefore part of its text: its generic plan reads the
    partial index of pending rows (``t_state_pending_ffqn``), never an index of every row of
    the function, which would read every finished execution at each claim. The table is
    analyzed as such a worker finds it: thousands of finished executions of the function and
    a few due (statistics of a near-empty table let either index look as cheap)."""
    from executions.store.locking import _due_candidates_sql
    from tests.support.helpers import TERMS

    _analyzed_table(finished=3000, due=3)
    plan = _generic_plan(*_due_candidates_sql({FFQN: TERMS}, timezone_now(), 5))
    assert "t_state_pending_ffqn" in plan, plan


def _analyzed_table(*, finished: int, due: int = 0, locked: int = 0) -> list[store.LockedExecution]:
    """``finished`` executions of ``FFQN`` run to their end, ``due`` ones pending and
    ``locked`` ones locked, all through the store; then ``t_state`` analyzed, so that the
    planner's statistics describe them. Returns the locked executions."""
    from executions.ids import new_executor_id, new_run_id
    from tests.support.helpers import ACTIVITY, DEPLOYMENT, TERMS

    now = timezone_now()

    def requests(count: int) -> list[store.CreateRequest]:
        return [
            store.CreateRequest(
                execution_id=str(ExecutionId.generate()),
                ffqn=FFQN,
                params=[n],
                component_id=ACTIVITY,
                deployment_id=DEPLOYMENT,
            )
            for n in range(count)
        ]

    store.create_many(requests(finished), now=now)
    claimed = store.lock_pending(
        {FFQN: TERMS},
        limit=finished,
        executor_id=new_executor_id(),
        run_id=new_run_id(),
        deployment_id=DEPLOYMENT,
        now=now,
    )
    store.append_many([store.AppendItem(c.execution_id, None, Finished(retval=Ok(1)), c.fence) for c in claimed])
    unfinished = requests(due + locked)
    store.create_many(unfinished, now=now)
    held = [lock(r.execution_id, now=now) for r in unfinished[due:]]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE t_state")
    return held


def _generic_plan(sql: str, params: list) -> str:
    """The plan PostgreSQL gives ``sql`` as the prepared statement a worker runs over and
    over: a generic plan, made without the parameters' values."""
    import re

    from executions.sql import client_side_cursor

    numbered = iter(range(1, 100))
    statement = re.sub("%s", lambda _: f"${next(numbered)}", sql)
    with client_side_cursor() as cursor:  # the values go into EXECUTE's text
        cursor.execute(f"PREPARE plan_probe AS {statement}")
        try:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
            cursor.execute(f"EXPLAIN EXECUTE plan_probe({', '.join(['%s'] * len(params))})", params)
            return "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("RESET plan_cache_mode")
            cursor.execute("DEALLOCATE plan_probe")


@pytest.mark.postgres_only
def test_a_group_commit_of_results_finds_its_rows_by_id_however_many_executions_are_locked():
    """The one-message group commit of results (D70) locks its rows through the primary
    key. Its fence test (state ``locked``) must not let the planner read them through the
    partial index of every locked row: that reads each execution locked anywhere (and each
    dead entry a bitmap scan never prunes) at every result, a cost that grows with the
    number of executions locked, awaiting workflows included. Its generic plan never reads
    ``t_state_locked_expiry``, not even where that index looks cheapest: thousands of rows,
    a few of them locked when the table was analyzed."""
    from executions.events import compact_json
    from executions.store.append import _FINISH_FIELDS, _finish_sql, _finished_rows

    locked = _analyzed_table(finished=3000, locked=3)
    now = timezone_now()
    ids = [locked[0].execution_id]
    rows, _, _ = _finished_rows(ids, [store.AppendItem(ids[0], None, Finished(retval=Ok(1)), locked[0].fence)], now)
    at = connection.ops.adapt_datetimefield_value(now)
    plan = _generic_plan(_finish_sql(_FINISH_FIELDS), [compact_json(rows), ids, at, at, notify.FINISHED])
    assert "t_state_locked_expiry" not in plan, plan


@pytest.mark.postgres_only
def test_a_claim_and_a_group_commit_read_rows_by_key_in_plans_made_while_the_tables_were_small():
    """D87: a worker's connection keeps the generic plan its claim and its group commit got
    when they were first prepared, until the tables are analyzed again. In a new
    deployment that is while the tables hold a few dozen executions, and on a server
    without autovacuum it is for good. Such a plan must still find each row by its key:
    one that reads the whole log, or the whole state table, at every claim or result
    costs more with every execution ever run (measured: 4,700 rows read per result, and
    ten times the server's work per claim, after 20,000 executions). The tables are
    shadowed here by never-analyzed copies of a few dozen executions, as a worker finds
    them in its first seconds."""
    from executions.events import compact_json
    from executions.ids import new_executor_id, new_run_id
    from executions.store.append import _FINISH_FIELDS, _finish_sql, _finished_rows
    from executions.store.claim import lock_document, new_lock
    from executions.store.locking import _claim_sql, _due_candidates_sql
    from tests.support.helpers import DEPLOYMENT, TERMS

    held = [lock(create(FFQN, [n])) for n in range(40)]
    now = timezone_now()
    at = connection.ops.adapt_datetimefield_value(now)
    locked = new_lock(TERMS, new_executor_id(), new_run_id(), DEPLOYMENT, now)
    names, document = lock_document(TERMS, locked)
    candidates, params = _due_candidates_sql({FFQN: TERMS}, now, 8)
    ids = [held[0].execution_id]
    rows, _, _ = _finished_rows(ids, [store.AppendItem(ids[0], None, Finished(retval=Ok(1)), held[0].fence)], now)
    with _never_analyzed_copies("t_state", "t_execution_log"):
        claim = _generic_plan(
            _claim_sql(candidates, names), [*params, compact_json([{"ffqn": FFQN, **document}]), at, at]
        )
        result = _generic_plan(_finish_sql(_FINISH_FIELDS), [compact_json(rows), ids, at, at, notify.FINISHED])
    assert "Seq Scan" not in claim, claim
    assert "Seq Scan" not in result, result


@pytest.mark.postgres_only
def test_the_reads_a_workflow_run_and_a_waiting_client_repeat_find_rows_by_key_in_plans_made_while_small():
    """D87, for the reads repeated at every workflow step and every wake-up of a waiting
    client: a run's history, its join sets' responses with their children's results, and
    the results of the executions a client waits for. Planned against never-analyzed copies
    of tables with a few dozen executions, as such a connection first prepares them, none
    reads a whole table (each did: the log, the responses and the state table)."""
    from executions.events import HistoryEventRecord
    from executions.sql import rows_by_key
    from executions.store import reads

    ids = [lock(create(FFQN, [n])).execution_id for n in range(40)][:3]
    history, history_params = rows_by_key("t_execution_log", "l", "execution_id", ids, "l.variant = %s")
    responses, responses_params = rows_by_key("t_join_set_response", "r", "execution_id", ids, "r.seq > %s")
    progress, progress_params = rows_by_key("t_state", "s", "execution_id", ids)
    with _never_analyzed_copies("t_state", "t_execution_log", "t_join_set_response"):
        plans = [
            _generic_plan(
                f"SELECT {reads._EVENT_COLUMNS_L} FROM {history} ORDER BY l.execution_id, l.version",
                [*history_params, HistoryEventRecord.VARIANT],
            ),
            _generic_plan(
                reads._RESPONSES_SQL.format(columns=reads._RESPONSE_COLUMNS, source=responses), [*responses_params, 0]
            ),
            _generic_plan(reads._PROGRESS_SQL.format(source=progress), progress_params),
        ]
    for plan in plans:
        assert "Seq Scan" not in plan, plan


@contextlib.contextmanager
def _never_analyzed_copies(*tables: str):
    """Temporary copies of ``tables``, with their rows, indexes and constraints, which
    shadow them in this session (``pg_temp`` comes first in the search path). The
    planner has no statistics of a new table: it sizes it by its pages, at least ten."""
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"CREATE TEMPORARY TABLE {table} (LIKE public.{table} INCLUDING ALL)")
            cursor.execute(f"INSERT INTO pg_temp.{table} SELECT * FROM public.{table}")
        try:
            yield
        finally:
            for table in tables:
                cursor.execute(f"DROP TABLE pg_temp.{table}")


def _foreign_keys_to_state(table: str) -> set[str]:
    """The columns of ``table`` that the database checks against ``t_state``."""
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute(f"PRAGMA foreign_key_list({table})")
            return {row[3] for row in cursor.fetchall() if row[2] == "t_state"}
        cursor.execute(
            "SELECT a.attname FROM pg_constraint c JOIN pg_attribute a"
            " ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)"
            " WHERE c.contype = 'f' AND c.conrelid = %s::regclass AND c.confrelid = 't_state'::regclass",
            [table],
        )
        return {row[0] for row in cursor.fetchall()}


def test_the_store_alone_keeps_the_log_and_responses_free_of_orphans_without_a_foreign_key_check():
    """D75: the two append-only tables every call writes carry no foreign key check (it cost
    an extra lookup of the state row per inserted row, at commit); the other per-execution
    tables keep theirs. An event or a result for an execution that does not exist is still
    refused by the store and leaves no row."""
    assert _foreign_keys_to_state("t_execution_log") == set()
    assert _foreign_keys_to_state("t_join_set_response") == set()
    assert _foreign_keys_to_state("t_delay") == {"execution_id"}

    missing = create()
    ExecutionEvent.store_objects.filter(execution_id=missing).delete()
    ExecutionState.store_objects.filter(execution_id=missing).delete()
    with pytest.raises(errors.NotFound):
        store.append(missing, 1, Unlocked(backoff_expires_at=timezone_now(), reason="gone"))
    fence = store.Fence(run_id="Run_01M91XDCDBC8N68QNF40XAJFF4", lock_generation=1)
    [refused] = store.append_many([store.AppendItem(missing, None, Finished(retval=Ok(1)), fence=fence)])
    assert isinstance(refused, errors.NotFound)
    assert not ExecutionEvent.objects.filter(execution_id=missing).exists()


@pytest.mark.postgres_only
@pytest.mark.parametrize("prefix", ["a:pkg/ifc.rare", "a:pkg/"])
def test_listing_by_function_prefix_is_answered_by_the_function_index_not_a_scan_of_every_execution(prefix):
    """``ffqn_prefix`` (the REST API's and the CLI's filter) is a ``LIKE 'prefix%'``. A
    btree under the server's collation cannot answer it (only under ``C``), so on a big
    table the listing read every execution; ``t_state_ffqn_created`` is built with
    ``varchar_pattern_ops`` on the function, which serves the prefix and an exact function
    alike (D84). Sequential scans are priced out so that the plan shows whether the index
    can answer at all, whatever the table's size."""
    from executions.store.listing import filter_executions

    query = filter_executions(store.ExecutionFilter(ffqn_prefix=prefix)).order_by("-created_at", "-execution_id")
    sql, params = query[:21].query.sql_with_params()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "t_state_ffqn_created" in plan, plan
    assert "~>=~" in plan, plan  # the prefix bounds the index scan
