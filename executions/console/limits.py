"""Bounded reads of the console: a count that stops at ``MAX_COUNT``, the paginator that
uses it, and ``without_jit``, the console's reads without PostgreSQL's JIT.

- ``capped_count``: ``COUNT(*)`` over a ``LIMIT``, so a list of a million says "more than
  10,000" instead of counting them (the executions list, the deployment and component
  pages' counts);
- ``CappedPaginator``: Django's paginator with that count; pages stop at the cap;
- ``without_jit``: the list's, the search's and the dashboard's reads with JIT off.

why: D94 (a count that stops at 10,000), D95 (reads without JIT)
"""

from __future__ import annotations

from contextlib import contextmanager

from django.core.paginator import Paginator
from django.db import DatabaseError, connection
from django.db.transaction import TransactionManagementError
from django.utils.functional import cached_property

MAX_COUNT = 10_000  # the paginator counts this many rows at most (D94)


def capped_count(queryset, cap: int | None = None) -> tuple[int, bool]:
    """``(count, capped)``: the rows of ``queryset``, counted up to ``cap`` (``MAX_COUNT``)
    by ``COUNT(*)`` over a ``LIMIT``, so the count reads at most ``cap + 1`` index entries."""
    cap = MAX_COUNT if cap is None else cap
    counted = queryset[: cap + 1].count()
    return min(counted, cap), counted > cap


@contextmanager
def without_jit():
    """The block's queries without PostgreSQL's JIT compilation (``SET jit = off`` for the
    session, ``RESET`` after; nothing on SQLite). The console's reads stop at a ``LIMIT``,
    but the planner prices a walk under one as the whole range: past ``jit_above_cost``
    PostgreSQL spent 0.4–0.6 s compiling queries that ran in 0.1 s (bench/console.py,
    D95). Not a transaction with ``SET LOCAL``: each read keeps its own snapshot and its
    locks only while it runs, as before."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SET jit = off")
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("RESET jit")
        except (DatabaseError, TransactionManagementError):
            pass  # an aborted transaction: its rollback undoes the SET as well


class CappedPaginator(Paginator):
    """Django's paginator with a bounded count: past ``MAX_COUNT`` rows the list says "more
    than" (``capped``) and pages stop there; filters narrow it down."""

    @cached_property
    def _capped(self) -> tuple[int, bool]:
        return capped_count(self.object_list)

    @cached_property
    def count(self) -> int:
        return self._capped[0]

    @property
    def capped(self) -> bool:
        return self._capped[1]
