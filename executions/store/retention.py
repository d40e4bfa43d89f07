"""Retention: deleting finished executions older than a cutoff, whole trees at a time.

A top-level execution that finished before the cutoff is deleted together with every
execution started in its join sets, at any depth (their ids start with its id and a
``.``), and everything that belongs to them: their rows in ``t_execution_log``,
``t_join_set_response`` (as parent and as child), ``t_delay``, ``t_log``,
``t_execution_backtrace`` and ``t_state``, i.e. every table with a foreign key to
``t_state``. Only whole trees go: a tree in which any execution is unfinished, or any row
is locked by another transaction, is kept whole (the next run looks at it again), so a
child is never deleted while its top-level execution is kept, and nothing a worker may still
write to is deleted. ``t_backtrace`` is content-addressed and shared between executions;
it is left alone (decisions.md D43).

Each batch is one short transaction. On PostgreSQL its rows are locked ``FOR UPDATE SKIP
LOCKED``, so retention never waits for a row another transaction holds; on SQLite every
write transaction holds the database lock, and batches keep that short.
"""

from __future__ import annotations

import time
from datetime import datetime

from django.db import connection, transaction
from django.db.models import Q

from executions import errors
from executions.models import ExecutionState
from executions.sql import Statements, in_list
from executions.state_machine import State
from executions.store.common import utc_now, write_transaction

MAX_BATCH_SIZE = 10_000
_TREES_PER_QUERY = 300  # roots whose trees one query reads (SQLite: 3 parameters each)
_IDS_PER_STATEMENT = 500  # ids in one DELETE's IN list (SQLite's parameter limit)


def delete_finished(
    older_than: datetime,
    *,
    batch_size: int = 1000,
    max_batches: int | None = None,
    max_seconds: float | None = None,
    dry_run: bool = False,
) -> int:
    """Delete every top-level execution that finished before ``older_than``, with its whole
    tree and everything that belongs to it; returns how many executions (rows of
    ``t_state``, children included) were deleted.

    Works in batches of up to ``batch_size`` top-level executions, each batch its own
    transaction; stops after ``max_batches`` batches, or before starting a batch once
    ``max_seconds`` have passed (a later run goes on). ``dry_run`` deletes nothing and
    returns how many executions would have been deleted.
    """
    older_than = utc_now(older_than)
    if not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise errors.ValidationFailed(f"batch size must be from 1 to {MAX_BATCH_SIZE}, got {batch_size!r}")
    if max_batches is not None and max_batches < 1:
        raise errors.ValidationFailed(f"max batches must be at least 1, got {max_batches!r}")
    started = time.monotonic()
    after: tuple[datetime, str] | None = None
    total = batches = 0
    while max_batches is None or batches < max_batches:
        if max_seconds is not None and batches and time.monotonic() - started >= max_seconds:
            break
        with transaction.atomic() if dry_run else write_transaction():
            roots = _candidates(older_than, batch_size, after, lock=not dry_run)
            if roots:
                last_id, last_created_at = roots[-1]
                after = (last_created_at, last_id)
                ids = _whole_finished_trees([root for root, _ in roots], lock=not dry_run)
                if not dry_run:
                    _delete(ids)
                total += len(ids)
        batches += 1
        if len(roots) < batch_size:
            break
    return total


def _locking() -> bool:
    return connection.vendor == "postgresql"


def _candidates(
    older_than: datetime, limit: int, after: tuple[datetime, str] | None, *, lock: bool
) -> list[tuple[str, datetime]]:
    """Top-level executions finished before ``older_than``, in ``(created_at, id)`` order
    after ``after`` (the last candidate of the previous batch, so a tree kept for any reason
    is not looked at again in this run). An execution is created before it finishes, so
    ``created_at < older_than`` too, which lets the ``created_at`` index drive the scan."""
    query = ExecutionState.objects.filter(
        is_top_level=True,
        state=State.FINISHED,
        pending_expires_finished__lt=older_than,  # a finished row's finish time
        created_at__lt=older_than,
    )
    if after is not None:
        created_at, execution_id = after
        query = query.filter(
            Q(created_at__gt=created_at) | Q(created_at=created_at, execution_id__gt=execution_id),
            created_at__gte=created_at,  # the same, as a range the index can start from
        )
    query = query.order_by("created_at", "execution_id")
    if lock and _locking():
        query = query.select_for_update(skip_locked=True)
    return [
        (execution_id, created_at)
        for execution_id, created_at in query.values_list("execution_id", "created_at")[:limit]
    ]


def _tree_sql(roots: list[str], *, lock: bool) -> tuple[str, list[str]]:
    """``(execution_id, state)`` of every execution in the trees of ``roots``: each root and
    the ids that start with it and a ``.``. Locking: ``state`` is that of the row as locked
    by this transaction, NULL for a row another transaction holds (skipped, never waited
    for). Raw SQL: the ORM takes longer to build a 500-way OR than the database to run it."""
    quote = connection.ops.quote_name
    table, column, state = quote(ExecutionState._meta.db_table), quote("execution_id"), quote("state")
    params = list(roots)
    if connection.vendor == "postgresql":
        # a LIKE prefix: answered from the primary key's varchar_pattern_ops index
        descendant = f"{column} LIKE %s"
        for root in roots:
            params.append(root.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + ".%")
    else:
        # SQLite's LIKE ignores case and no index serves it; text compares bytewise here, so
        # the ids starting with "<root>." are exactly those from "<root>." to "<root>/"
        descendant = f"({column} >= %s AND {column} < %s)"
        for root in roots:
            params.extend((root + ".", root + "/"))
    where = f"{column} IN ({', '.join(['%s'] * len(roots))})" + f" OR {descendant}" * len(roots)
    if not (lock and _locking()):
        return f"SELECT {column}, {state} FROM {table} WHERE {where}", params
    sql = (
        f"WITH tree AS (SELECT {column} FROM {table} WHERE {where}), "
        f"held AS (SELECT {column}, {state} FROM {table} WHERE {column} IN (SELECT {column} FROM tree) "
        "FOR UPDATE SKIP LOCKED) "
        f"SELECT tree.{column}, held.{state} FROM tree LEFT JOIN held ON held.{column} = tree.{column}"
    )
    return sql, params


def _whole_finished_trees(roots: list[str], *, lock: bool) -> list[str]:
    """The ids of every execution in those trees of ``roots`` whose executions are all
    finished and (when locking) all locked by this transaction."""
    ids: list[str] = []
    for start in range(0, len(roots), _TREES_PER_QUERY):
        sql, params = _tree_sql(roots[start : start + _TREES_PER_QUERY], lock=lock)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        # unfinished, or (state NULL) held by another transaction: the whole tree stays
        keep = {_root(execution_id) for execution_id, state in rows if state != State.FINISHED}
        ids.extend(execution_id for execution_id, _ in rows if _root(execution_id) not in keep)
    return ids


def _root(execution_id: str) -> str:
    return execution_id.split(".", 1)[0]


def _dependent_tables() -> list[tuple[str, str]]:
    """``(table, column)`` of every foreign key to ``t_state``: what belongs to an execution."""
    return sorted(
        (relation.related_model._meta.db_table, relation.field.column)
        for relation in ExecutionState._meta.related_objects
    )


def _delete(ids: list[str]) -> None:
    """Delete the executions ``ids`` and every row that references them (the caller holds
    their row locks). A response whose child is in ``ids`` has its parent there too."""
    quote = connection.ops.quote_name
    state_table, state_column = ExecutionState._meta.db_table, ExecutionState._meta.pk.column
    statements = Statements()
    for start in range(0, len(ids), _IDS_PER_STATEMENT):
        where, params = in_list(ids[start : start + _IDS_PER_STATEMENT])
        for table, column in [*_dependent_tables(), (state_table, state_column)]:
            statements.add(f"DELETE FROM {quote(table)} WHERE {quote(column)} {where}", params)
        statements.run()
