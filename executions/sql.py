"""Several statements of one transaction in one round trip (the store's hot paths).

On PostgreSQL a network round trip costs more than the statements it carries, and Django's
psycopg cursors bind parameters client-side, which lets one ``execute`` carry several
statements. ``Statements`` collects the writes of a store operation and sends them
together; SQLite runs in-process, so there they simply run one after another. Values are
adapted by the model fields themselves (``get_db_prep_save``), as the ORM would.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import DateTimeField, Model


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


def in_list(values: list) -> tuple[str, list]:
    """``(sql, params)`` for ``<column> IN (values)``: on PostgreSQL one array parameter
    (``= ANY``), so the statement's text does not depend on how many values there are."""
    if connection.vendor == "postgresql":
        return "= ANY(%s)", [values]
    return f"IN ({', '.join(['%s'] * len(values))})", values


@functools.cache
def _json_encoders(model: type[Model], fields: tuple[str, ...]) -> list:
    """Per field, how its value goes into the JSON document of a PostgreSQL insert:
    datetimes as ISO 8601 text, everything else (JSON values included) as it is."""
    out = []
    for name in fields:
        field = model._meta.get_field(name)
        out.append(_iso if isinstance(field, DateTimeField) else _identity)
    return out


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
        meta_fields = [model._meta.get_field(name) for name in fields]
        columns = ", ".join(_quote(f.column) for f in meta_fields)
        table = _quote(model._meta.db_table)
        if connection.vendor == "postgresql":
            encoders = _json_encoders(model, tuple(fields))
            record = ", ".join(f"{_quote(f.column)} {f.db_type(connection)}" for f in meta_fields)
            sql = f"INSERT INTO {table} ({columns}) SELECT {columns} FROM json_to_recordset(%s) AS r({record})"
            rows = [
                {f.column: encode(getattr(obj, f.attname)) for f, encode in zip(meta_fields, encoders, strict=False)}
                for obj in objects
            ]
            params = [json.dumps(rows, ensure_ascii=False, allow_nan=False, separators=(",", ":"))]
        else:
            preps = [functools.partial(_prep_save, f) for f in meta_fields]
            row = "(" + ", ".join(["%s"] * len(meta_fields)) + ")"
            sql = f"INSERT INTO {table} ({columns}) VALUES " + ", ".join([row] * len(objects))
            params = [
                prep(getattr(obj, f.attname)) for obj in objects for f, prep in zip(meta_fields, preps, strict=False)
            ]
        if ignore_conflicts:
            sql += " ON CONFLICT DO NOTHING"
        self.add(sql, params)

    def update(
        self,
        model: type[Model],
        pks: Sequence[Any],
        values: dict[str, Any],
        plus_one: dict[str, str] | None = None,
    ) -> None:
        """``UPDATE`` the rows ``pks``: set ``values``, and each ``plus_one`` field to another
        field's current value + 1 (``{"version": "version"}`` increments it)."""
        meta = model._meta
        assignments, params = [], []
        for name, source in (plus_one or {}).items():
            assignments.append(f"{_quote(meta.get_field(name).column)} = {_quote(meta.get_field(source).column)} + 1")
        for name, value in values.items():
            field = meta.get_field(name)
            assignments.append(f"{_quote(field.column)} = %s")
            params.append(field.get_db_prep_save(value, connection))
        where, keys = in_list(list(pks))
        sql = f"UPDATE {_quote(meta.db_table)} SET {', '.join(assignments)} WHERE {_quote(meta.pk.column)} {where}"
        self.add(sql, params + keys)

    def can_run_in_own_transaction(self) -> bool:
        """Whether ``run_in_own_transaction`` sends one message: on PostgreSQL, outside any
        ``atomic`` block."""
        return connection.vendor == "postgresql" and not connection.in_atomic_block and connection.get_autocommit()

    def run_in_own_transaction(self) -> list[tuple]:
        """Run everything collected as one transaction in one round trip: PostgreSQL runs
        the statements of one simple-protocol message as a single implicit transaction,
        all or nothing, committed at its end (no ``BEGIN``/``COMMIT`` round trips). Only
        when ``can_run_in_own_transaction``."""
        assert self.can_run_in_own_transaction()
        return self.run()

    def run(self) -> list[tuple]:
        """Execute everything collected; return the rows of the last statement (if any)."""
        items, self._items = self._items, []
        if not items:
            return []
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute("; ".join(sql for sql, _ in items), [p for _, params in items for p in params])
                while cursor.nextset():
                    pass
            else:
                for sql, params in items:
                    cursor.execute(sql, params)
            return cursor.fetchall() if cursor.description else []
