"""Several statements of one transaction in one round trip (the store's hot paths).

``Statements`` collects the writes of a store operation and sends them together: inside a
transaction in psycopg's pipeline mode, each statement prepared; as a transaction of its
own, as one statement whose writes are CTEs (``run_as_one_statement``) or one
simple-protocol message of several (``run_in_own_transaction``). ``rows_by_key`` reads rows
one key at a time. SQLite runs them one after another. Values are adapted by the model
fields themselves (``get_db_prep_save``), as the ORM would.

why: D48, D59, D69, D70, D71, D87, D130
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections
from django.db.models import DateTimeField, Model

from executions.events import compact_json

# psycopg parses a statement's ``%s`` placeholders into ``$n`` at every execute, except for
# statements short enough for its cache (4,096 bytes and 50 parameters): a longer one is often
# a one-off bulk statement that would only churn the cache. The store's statements have one
# text per shape (``in_list``'s one array parameter, ``json_to_recordset``'s one document),
# and the hot paths' are longer than that (D70's group commit of results, D126's local
# call), so each write parsed its statement again: about 8 % of a workflow step's CPU (D130).
STATEMENT_CACHE_LIMITS = (16_384, 500)  # bytes, parameters: above every statement of the store (6 KB at most)


def cache_the_stores_statements() -> None:
    """Let psycopg's cache of parsed statements hold the store's long ones (D130). Its limits
    are module constants read at every execute; only ever raised here, never lowered."""
    from psycopg import _queries

    length, params = STATEMENT_CACHE_LIMITS
    _queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, length)
    _queries.MAX_CACHED_STATEMENT_PARAMS = max(_queries.MAX_CACHED_STATEMENT_PARAMS, params)


cache_the_stores_statements()  # on import: every process that writes through the store has imported this module


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def in_list(values: list) -> tuple[str, list]:
    """``(sql, params)`` for ``<column> IN (values)``: on PostgreSQL one array parameter
    (``= ANY``), so the statement's text does not depend on how many values there are."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [values]
    return f"IN ({', '.join(['%s'] * len(values))})", values


def rows_by_key(table: str, alias: str, column: str, values: list, condition: str = "") -> tuple[str, list]:
    """``(sql, params)`` to follow ``FROM``: the rows ``alias`` of ``table`` whose ``column``
    is one of ``values`` (and that meet ``condition``, whose parameters follow).

    On PostgreSQL each value is looked up in a ``LATERAL`` subquery of its own, so that the
    plan is a probe of the key's index even when it was made while the table was small,
    where ``= ANY(values)`` reads the whole table for as long as the plan is kept (D87).
    (``OFFSET 0`` keeps the planner from flattening the subquery into a join, which it
    may then plan as that same whole-table read.) The rows come in no particular order."""
    extra = f" AND {condition}" if condition else ""
    if connection.vendor == "postgresql":
        lookup = f"SELECT * FROM {table} {alias} WHERE {alias}.{column} = k.key{extra} OFFSET 0"
        return f"unnest(%s::text[]) AS k(key) CROSS JOIN LATERAL ({lookup}) AS {alias}", [values]
    where, params = in_list(values)
    return f"{table} {alias} WHERE {alias}.{column} {where}{extra}", params


@dataclass(frozen=True)
class _InsertShape:
    """The text of an ``INSERT`` of some fields of a model, built once per shape."""

    vendor: str
    sql: str
    fields: tuple
    encoders: tuple = ()  # PostgreSQL: (column, attname, encode) per field
    row: str = ""  # SQLite: one row's placeholders, repeated per object
    suffix: str = ""

    @staticmethod
    @functools.cache
    def of(model: type[Model], names: tuple[str, ...], vendor: str, ignore_conflicts: bool) -> _InsertShape:
        fields = tuple(model._meta.get_field(name) for name in names)
        columns = ", ".join(_quote(f.column) for f in fields)
        table = _quote(model._meta.db_table)
        suffix = " ON CONFLICT DO NOTHING" if ignore_conflicts else ""
        if vendor == "postgresql":
            record = recordset_columns(model, names)
            sql = f"INSERT INTO {table} ({columns}) SELECT {columns} FROM json_to_recordset(%s) AS r({record}){suffix}"
            encoders = tuple((f.column, f.attname, _encoder(f)) for f in fields)
            return _InsertShape(vendor, sql, fields, encoders=encoders)
        row = "(" + ", ".join(["%s"] * len(fields)) + ")"
        return _InsertShape(vendor, f"INSERT INTO {table} ({columns}) VALUES ", fields, row=row, suffix=suffix)


@functools.cache
def recordset_columns(model: type[Model], names: tuple[str, ...]) -> str:
    """The typed columns of the fields ``names`` for ``json_to_recordset(...) AS r(...)``."""
    return ", ".join(f"{_quote(f.column)} {f.db_type(connection)}" for f in map(model._meta.get_field, names))


def recordset_values(model: type[Model], names: tuple[str, ...], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` of the fields ``names`` as a row of a ``json_to_recordset`` document goes,
    by column: timestamps as ISO text, as ``Statements.insert`` sends them."""
    return {column: encode(values[name]) for name, (column, encode) in zip(names, _encoders(model, names), strict=True)}


@functools.cache
def _encoders(model: type[Model], names: tuple[str, ...]) -> tuple:
    return tuple((f.column, _encoder(f)) for f in map(model._meta.get_field, names))


@functools.cache
def assignments_from(model: type[Model], names: tuple[str, ...], source: str) -> str:
    """``col = source.col, ...`` of the fields ``names``, for an ``UPDATE … FROM`` a recordset."""
    return ", ".join(f"{_quote(f.column)} = {source}.{_quote(f.column)}" for f in map(model._meta.get_field, names))


def _encoder(field):
    return _iso if isinstance(field, DateTimeField) else _identity


@functools.cache
def _update_head(model: type[Model], names: tuple, plus_one: tuple, vendor: str) -> tuple[str, tuple]:
    """``UPDATE … SET … WHERE <pk>`` for these fields, built once; and the fields."""
    meta = model._meta
    fields = tuple(meta.get_field(name) for name in names)
    assignments = [
        f"{_quote(meta.get_field(name).column)} = {_quote(meta.get_field(source).column)} + 1"
        for name, source in plus_one
    ]
    assignments += [f"{_quote(field.column)} = %s" for field in fields]
    return f"UPDATE {_quote(meta.db_table)} SET {', '.join(assignments)} WHERE {_quote(meta.pk.column)}", fields


def _iso(value: datetime | None) -> str | None:
    if value is not None and value.tzinfo is None:
        raise ValueError("timestamps must be timezone-aware")
    return None if value is None else value.isoformat()


def _identity(value: Any) -> Any:
    return value


def _prep_save(field, value: Any) -> Any:
    return field.get_db_prep_save(value, connection)


class Statements:
    """An ordered batch of SQL statements for the current transaction."""

    def __init__(self):
        self._items: list[tuple[str, list]] = []

    def add(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._items.append((sql, list(params)))

    def insert(
        self, model: type[Model], objects: Iterable[Model], fields: Sequence[str], *, ignore_conflicts: bool = False
    ) -> None:
        """``INSERT`` the objects' ``fields`` (one multi-row statement); with
        ``ignore_conflicts``, rows that would violate a unique constraint are skipped.

        On PostgreSQL the rows go as one JSON document (``json_to_recordset``), so the
        statement's text is the same for any number of rows and the driver quotes one
        string, instead of parsing a statement with thousands of placeholders per batch.
        JSON columns are embedded as they are: ``json`` keeps their text exactly."""
        objects = list(objects)
        if not objects:
            return
        shape = _InsertShape.of(model, tuple(fields), connection.vendor, ignore_conflicts)
        if shape.vendor == "postgresql":
            rows = [
                {column: encode(getattr(obj, attname)) for column, attname, encode in shape.encoders} for obj in objects
            ]
            self.add(shape.sql, [compact_json(rows)])
        else:
            sql = shape.sql + ", ".join([shape.row] * len(objects)) + shape.suffix
            self.add(sql, [_prep_save(f, getattr(obj, f.attname)) for obj in objects for f in shape.fields])

    def update(
        self,
        model: type[Model],
        pks: Sequence[Any],
        values: dict[str, Any],
        plus_one: dict[str, str] | None = None,
    ) -> None:
        """``UPDATE`` the rows ``pks``: set ``values``, and each ``plus_one`` field to another
        field's current value + 1 (``{"version": "version"}`` increments it)."""
        head, fields = _update_head(model, tuple(values), tuple((plus_one or {}).items()), connection.vendor)
        params = [_prep_save(field, value) for field, value in zip(fields, values.values(), strict=True)]
        where, keys = in_list(list(pks))
        self.add(f"{head} {where}", params + keys)

    def take(self) -> list[tuple[str, list]]:
        """The statements collected, ``(sql, params)`` each, which are then no longer this
        batch's: a caller composing them into a statement of its own (D126)."""
        items, self._items = self._items, []
        return items

    def can_run_in_own_transaction(self) -> bool:
        """Whether ``run_in_own_transaction`` sends one message: on PostgreSQL, outside any
        ``atomic`` block. (The connection is looked up once: each attribute of Django's
        ``connection`` proxy is a lookup of its own, and a submit asks this twice.)"""
        db = connections[DEFAULT_DB_ALIAS]
        return db.vendor == "postgresql" and not db.in_atomic_block and db.get_autocommit()

    def run_in_own_transaction(self) -> list[tuple]:
        """Run everything collected as one transaction in one round trip: PostgreSQL runs
        the statements of one simple-protocol message as a single implicit transaction,
        all or nothing, committed at its end (no ``BEGIN``/``COMMIT`` round trips). Only
        when ``can_run_in_own_transaction``."""
        assert self.can_run_in_own_transaction()
        return self.run()

    def run_as_one_statement(self) -> None:
        """Run everything collected as ONE statement, in its own transaction: the writes
        become data-modifying CTEs of the last statement. One statement can be prepared
        (D71), where a message of several cannot; the server then skips parsing and planning
        it. The parts share one snapshot and do not see each other's rows, so only a batch
        of independent writes may go this way (a create: its row, its event, its NOTIFY).
        What the statement returns is not read (describing its columns cost a submit 7 %
        of its time in the client). Only when ``can_run_in_own_transaction``."""
        assert self.can_run_in_own_transaction()
        *writes, (last_sql, last_params) = self._items
        self._items = []
        ctes = ", ".join(f"w{index} AS ({sql})" for index, (sql, _) in enumerate(writes))
        params = [p for _, params in writes for p in params] + last_params
        with connection.cursor() as cursor:
            cursor.execute(f"WITH {ctes} {last_sql}" if writes else last_sql, params)

    def run(self) -> list[tuple]:
        """Execute everything collected; return the rows of the last statement (if any)."""
        items, self._items = self._items, []
        if not items:
            return []
        if connection.vendor == "postgresql" and len(items) > 1 and connection.in_atomic_block:
            return _run_pipelined(items)
        if connection.vendor == "postgresql" and len(items) > 1:
            with client_side_cursor() as cursor:
                cursor.execute("; ".join(sql for sql, _ in items), [p for _, params in items for p in params])
                while cursor.nextset():
                    pass
                return cursor.fetchall() if cursor.description else []
        with connection.cursor() as cursor:
            for sql, params in items:
                cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []


def _run_pipelined(items: list[tuple[str, list]]) -> list[tuple]:
    """The statements of an open transaction in one round trip: psycopg's pipeline mode
    sends them together and reads their results at its end; each is a prepared statement
    once the connection has run it a few times (D71).

    A failed statement's error may be read back while a later one is being sent: it is
    raised from that ``execute``, and then the pipeline's end reports the statements the
    server skipped after it (``PipelineAborted``). The first error is the one raised. It is
    caught inside the pipeline's block, because psycopg logs a warning when its pipeline
    ends under an exception."""
    failed = None
    with connection.cursor() as cursor, connection.wrap_database_errors:
        try:
            with connection.connection.pipeline():
                for sql, params in items:
                    try:
                        cursor.execute(sql, params)
                    except DatabaseError as error:  # Django's cursor wraps psycopg's errors
                        failed = error
                        break
        except psycopg.Error:
            if failed is None:
                raise
        if failed is not None:
            raise failed
        return cursor.fetchall() if cursor.description else []


def client_side_cursor():
    """A Django cursor that binds parameters client-side (psycopg's ``ClientCursor``), so
    one ``execute`` may carry several statements in one simple-protocol message.

    The connection's own cursors bind server-side, so that psycopg prepares the statements
    a process runs again and again (D71); the extended protocol that needs takes one
    statement per message."""
    connection.ensure_connection()
    with connection.wrap_database_errors:
        # ``_prepare_cursor`` wraps it as ``connection.cursor()`` would: query logging,
        # ``execute_wrapper``s and Django's database errors.
        return connection._prepare_cursor(psycopg.ClientCursor(connection.connection))
