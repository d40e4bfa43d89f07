"""Several statements of one transaction in one round trip (the store's hot paths).

On PostgreSQL a network round trip costs more than the statements it carries, and Django's
psycopg cursors bind parameters client-side, which lets one ``execute`` carry several
statements. ``Statements`` collects the writes of a store operation and sends them
together; SQLite runs in-process, so there they simply run one after another. Values are
adapted by the model fields themselves (``get_db_prep_save``), as the ORM would.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connection
from django.db.models import Model


def _quote(name: str) -> str:
    return connection.ops.quote_name(name)


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
        ``ignore_conflicts``, rows that would violate a unique constraint are skipped."""
        objects = list(objects)
        if not objects:
            return
        meta_fields = [model._meta.get_field(name) for name in fields]
        row = "(" + ", ".join(["%s"] * len(meta_fields)) + ")"
        columns = ", ".join(_quote(f.column) for f in meta_fields)
        sql = f"INSERT INTO {_quote(model._meta.db_table)} ({columns}) VALUES " + ", ".join([row] * len(objects))
        if ignore_conflicts:
            sql += " ON CONFLICT DO NOTHING"
        params = [f.get_db_prep_save(getattr(obj, f.attname), connection) for obj in objects for f in meta_fields]
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
        where = ", ".join(["%s"] * len(pks))
        sql = f"UPDATE {_quote(meta.db_table)} SET {', '.join(assignments)} WHERE {_quote(meta.pk.column)} IN ({where})"
        self.add(sql, params + list(pks))

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
