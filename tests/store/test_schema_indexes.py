"""The engine's tables carry no index twice (D128).

No update of ``t_state`` is HOT (``state`` is indexed), so every state change writes an
entry into each of its indexes, and every insert does too: an index that repeats another
one's columns, operator classes and condition costs every write and serves no query. The
check reads the indexes as the database holds them, including the ones Django makes on
its own (PostgreSQL's ``…_like`` index of a text primary key, SQLite's automatic index
of a primary key), on both databases.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db

ENGINE_APPS = ("obelisk_executions", "obelisk_deployments")


def _engine_tables() -> list[str]:
    return sorted({model._meta.db_table for label in ENGINE_APPS for model in apps.get_app_config(label).get_models()})


def _postgres_indexes(table: str) -> dict[str, str]:
    """Each index's definition without its name: what it indexes, how, and where."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        return {name: definition.replace(f" {name} ", " ", 1) for name, definition in cursor.fetchall()}


def _sqlite_indexes(table: str) -> dict[str, str]:
    """Each index's columns, and its condition for a partial one."""
    with connection.cursor() as cursor:
        cursor.execute(f'PRAGMA index_list("{table}")')
        listed = [(row[1], row[4]) for row in cursor.fetchall()]  # name, partial
        out = {}
        for name, partial in listed:
            cursor.execute(f'PRAGMA index_info("{name}")')
            columns = ",".join(row[2] for row in cursor.fetchall())
            cursor.execute("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = %s", [name])
            sql = (cursor.fetchone() or [None])[0] or ""
            where = re.split(r"\bWHERE\b", sql, maxsplit=1, flags=re.IGNORECASE)[1].strip() if partial else ""
            out[name] = f"({columns}) {where}"
        return out


def _duplicates(indexes: dict[str, str]) -> list[list[str]]:
    """Names of the indexes whose definitions are equal, as groups. Uniqueness does not
    count: a plain index on what a unique one indexes already is as redundant."""
    by_definition = defaultdict(list)
    for name, definition in indexes.items():
        by_definition[definition.replace("CREATE UNIQUE INDEX", "CREATE INDEX")].append(name)
    return [sorted(names) for names in by_definition.values() if len(names) > 1]


def test_no_engine_table_carries_the_same_index_twice():
    read = _postgres_indexes if connection.vendor == "postgresql" else _sqlite_indexes
    tables = _engine_tables()
    assert "t_state" in tables and "t_execution_log" in tables
    found = {table: _duplicates(read(table)) for table in tables}
    assert {table: groups for table, groups in found.items() if groups} == {}


def test_the_tree_of_an_execution_still_has_its_pattern_index_without_t_state_id_prefix():
    """D94's tree read (``<id>.%``) is a range of an index on ``execution_id`` with
    ``varchar_pattern_ops`` on PostgreSQL, whatever the server's collation: after the drop,
    the one Django makes for the text primary key is that index (SQLite ranges over the
    primary key itself)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite ranges over the primary key itself")
    definitions = _postgres_indexes("t_state")
    assert "t_state_id_prefix" not in definitions
    serving = [name for name, definition in definitions.items() if "(execution_id varchar_pattern_ops)" in definition]
    assert len(serving) == 1 and serving[0].endswith("_like"), definitions
