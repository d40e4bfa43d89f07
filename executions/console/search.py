"""The executions list's search: a whole execution id anywhere, else part of an id, part of
a function name, or words of an error or a failure among the newest ``SEARCH_SCOPE``
executions the filters select.

A whole id shows that execution whatever the filters (a child's too: pasted from a log or
a URL). Any other term reads a range of ``t_state_created`` (the creation time of the
``SEARCH_SCOPE``-th newest row bounds it) and, of those executions, the result and failed
attempt events by key (``store.find_by_result_text``): bounded at any table size. The
help text under the search box says so (``SEARCH_HELP``).

why: D95
"""

from __future__ import annotations

from django.db.models import Q

from executions import errors, store
from executions.models import ExecutionState
from executions.store.listing import filter_text as check_search_text

MAX_SEARCH_IDS = 500
SEARCH_SCOPE = 20_000  # newest executions a search by part of a text reads (D95)
SEARCH_HELP = (
    "A whole execution id; or part of an id, a function name, or words of an error or a failure,"
    f" among the newest {SEARCH_SCOPE:,} executions the filters select."
)


def searched_scope(queryset):
    """``queryset`` from the creation time of its ``SEARCH_SCOPE``-th newest row on: what a
    search by part of a text reads (D95). One walk of ``t_state_created``."""
    newest = queryset.order_by("-created_at", "-execution_id").values_list("created_at", flat=True)
    bound = list(newest[SEARCH_SCOPE - 1 : SEARCH_SCOPE])
    return queryset.filter(created_at__gte=bound[0]) if bound else queryset


def search_executions(queryset, search_term: str):
    """The rows of ``queryset`` (the filtered list) that ``search_term`` finds; a whole
    execution id finds its execution whatever the filters."""
    term = search_term.strip()
    if not term:
        return queryset
    try:
        check_search_text(term, "search text")
    except errors.StoreError:  # a NUL, a lone surrogate, or over 1,024 characters
        return queryset.none()
    exact = ExecutionState.objects.filter(pk=term)
    if exact.exists():
        return exact.order_by(*queryset.query.order_by)
    scope = searched_scope(queryset)
    condition = Q(execution_id__icontains=term) | Q(ffqn__icontains=term)
    try:
        ids = store.find_by_result_text(term, limit=MAX_SEARCH_IDS, within=scope)
    except (errors.StoreError, ValueError):
        ids = []
    if ids:
        condition |= Q(pk__in=ids)
    return scope.filter(condition)
