"""Listing and reading executions (spec 000 §7.3-§7.4): keyset pages visit every row once in
both directions, filters by status and prefix, events and responses paged, and the reads
(``get``, events, finished results, waiting for one) agree with each other.

Every test drives the store through its public API with explicit ``now=`` values (``T0`` lies
in the future, so wall-clock time never matters) and asserts what is read back from the
database; "nothing written" is ``db_snapshot()`` equal before and after. The spec is spec 000
and the decisions in ``../shared/spec/README.md`` (next to this repository).

why: D15, D52
"""

from __future__ import annotations

import dataclasses

import pytest

from executions import errors, store
from executions.events import (
    Err,
    ExecutionFailure,
    Finished,
    Ok,
)
from executions.ids import ExecutionId
from tests.support.conformance import (
    at,
    blocked_workflow,
    finish,
    persist,
    row,
    submit_children,
)
from tests.support.helpers import (
    FFQN,
    T0,
    create,
    create_workflow,
    lock,
)

pytestmark = pytest.mark.django_db


# ---------------------------------------------------------------------------------------
# Listing executions (spec 000 §7.4 list_executions, with keyset cursors)
# ---------------------------------------------------------------------------------------


def _walk(direction: str, limit: int, cursor: str | None = None) -> list[store.Page]:
    """Follow ``older_cursor`` (or ``newer_cursor``) from the page at ``cursor`` to the end."""
    key = "older_than" if direction == "older" else "newer_than"
    pages = [store.list_executions(limit=limit, **({key: cursor} if cursor else {}))]
    while (cursor := pages[-1].older_cursor if direction == "older" else pages[-1].newer_cursor) is not None:
        pages.append(store.list_executions(limit=limit, **{key: cursor}))
        assert len(pages) <= 30
    return pages


def _ids(pages: list[store.Page]) -> list[str]:
    return [r.execution_id for page in pages for r in page.items]


@pytest.mark.parametrize("limit", [1, 4, 7, 25, 30])
def test_list_executions_pages_visit_every_row_exactly_once_in_both_directions(limit):
    # groups of three with identical created_at; times alternate whole and fractional seconds
    created = [(at(i // 3 * 0.5), create(now=at(i // 3 * 0.5))) for i in range(25)]
    expected = [eid for _, eid in sorted(created, reverse=True)]  # newest first, ties by id descending
    older = _walk("older", limit)
    assert _ids(older) == expected
    assert [len(page.items) for page in older[:-1]] == [limit] * (len(older) - 1)
    assert older[0].newer_cursor is None
    if len(older) == 1:
        return
    # walking back from the oldest page visits every other row once, each page newest first
    newer = _walk("newer", limit, older[-1].newer_cursor)
    assert _ids(list(reversed(newer))) + _ids(older[-1:]) == expected


def test_list_executions_newer_cursor_returns_the_previous_page():
    for i in range(10):
        create(now=at(i // 2))
    first = store.list_executions(limit=4)
    assert first.newer_cursor is None and first.older_cursor is not None
    second = store.list_executions(limit=4, older_than=first.older_cursor)
    back = store.list_executions(limit=4, newer_than=second.newer_cursor)
    assert [r.execution_id for r in back.items] == [r.execution_id for r in first.items]
    assert back.newer_cursor is None


def _listed(filters: store.ExecutionFilter, now=None) -> set[str]:
    return {r.execution_id for r in store.list_executions(filters, limit=1000, now=now).items}


def test_list_executions_status_filters():
    pending = create(now=T0)
    scheduled = create(now=T0, scheduled_at=at(1000))
    locked = create(now=T0)
    lock(locked, now=T0)
    blocked, _, _, child = blocked_workflow(T0)
    paused = create(now=T0, paused=True)
    cancelling = create(now=T0)
    store.cancel(cancelling, now=at(1))
    finished_ok = create(now=T0)
    finish(finished_ok, Ok(1), now=at(1))
    finished_error = create(now=T0)
    finish(finished_error, Err("no"), now=at(1))
    finished_failure = create(now=T0)
    finish(finished_failure, ExecutionFailure("uncategorized"), now=at(1))
    now = at(100)
    expected = {
        "pending": {pending},
        "scheduled": {scheduled},
        "locked": {locked},
        "blocked": {blocked},
        "paused": {paused},
        "cancelling": {cancelling},
        "finished": {finished_ok, finished_error, finished_failure},
        "finished_ok": {finished_ok},
        "finished_error": {finished_error},
        "finished_failure": {finished_failure},
    }
    assert set(expected) == set(store.STATUS_FILTERS)
    for status, ids in expected.items():
        assert _listed(store.ExecutionFilter(statuses=(status,)), now) == ids, status
    assert _listed(store.ExecutionFilter(statuses=("paused", "cancelling", "finished_ok")), now) == {
        paused, cancelling, finished_ok,
    }  # fmt: skip
    everything = set().union(*expected.values())
    assert _listed(store.ExecutionFilter(), now) == everything
    assert _listed(store.ExecutionFilter(hide_finished=True), now) == everything - expected["finished"]
    assert _listed(store.ExecutionFilter(show_derived=True), now) == everything | {child}
    assert _listed(store.ExecutionFilter(show_derived=True, statuses=("pending",)), now) == {pending, child}
    # "pending" and "scheduled" depend on the `now` of the query
    assert _listed(store.ExecutionFilter(statuses=("pending",)), at(1000)) == {pending, scheduled}


def test_list_executions_prefix_filters():
    ids = {ffqn: create(ffqn, now=T0) for ffqn in ("a:pkg/ifc.fn", "a:pkg/ifc.other", "a:pkg2/ifc.fn", "b:pkg/ifc.fn")}
    assert _listed(store.ExecutionFilter(ffqn_prefix="a:pkg/")) == {ids["a:pkg/ifc.fn"], ids["a:pkg/ifc.other"]}
    assert _listed(store.ExecutionFilter(ffqn_prefix="a:pkg/ifc.fn")) == {ids["a:pkg/ifc.fn"]}
    assert _listed(store.ExecutionFilter(ffqn_prefix="a:")) == set(ids.values()) - {ids["b:pkg/ifc.fn"]}
    family = [create(execution_id=f"E_01ARZ3NDEKTSV4RRFFQ69G5FA{c}", now=T0) for c in "ABC"]
    stranger = create(execution_id="E_01BRZ3NDEKTSV4RRFFQ69G5FAV", now=T0)
    assert _listed(store.ExecutionFilter(execution_id_prefix="E_01ARZ")) == set(family)
    assert _listed(store.ExecutionFilter(execution_id_prefix=stranger)) == {stranger}
    (kid,) = submit_children(family[0], "n:js", 1, now=T0)
    assert _listed(store.ExecutionFilter(execution_id_prefix=family[0])) == {family[0]}
    assert _listed(store.ExecutionFilter(execution_id_prefix=family[0], show_derived=True)) == {family[0], kid}
    assert _listed(store.ExecutionFilter(execution_id_prefix=kid, show_derived=True)) == {kid}


@pytest.mark.parametrize(
    "kwargs",
    [
        {"older_than": "not-a-cursor"},
        {"newer_than": "%%%"},
        {"older_than": "eWVzdGVyZGF5fEVfMQ"},  # base64 of "yesterday|E_1"
        {"filters": store.ExecutionFilter(statuses=("running",))},
        {"filters": store.ExecutionFilter(statuses=("pending", "nope"))},
    ],
)
def test_list_executions_rejects_invalid_cursors_and_statuses(kwargs):
    create(now=T0)
    with pytest.raises(errors.ValidationFailed):
        store.list_executions(**kwargs)


# ---------------------------------------------------------------------------------------
# Listing events and responses (spec 000 §7.4 list_execution_events, list_responses)
# ---------------------------------------------------------------------------------------


def test_list_events_pages_and_max_version():
    execution_id = create(now=T0)
    store.append_batch(execution_id, 1, [persist() for _ in range(6)], now=at(1))
    all_events = store.get(execution_id).events
    assert [e.version for e in all_events] == list(range(7))
    seen = []
    from_version = 0
    while True:
        events, max_version = store.list_events(execution_id, from_version=from_version, limit=3)
        assert max_version == 6
        if not events:
            break
        assert len(events) <= 3
        seen.extend(events)
        from_version = events[-1].version + 1
    assert seen == all_events
    assert store.list_events(execution_id, from_version=6, limit=3) == ([all_events[6]], 6)
    assert store.list_events(execution_id, from_version=7) == ([], 6)


def test_list_events_of_an_unknown_execution_is_not_found():
    with pytest.raises(errors.NotFound):
        store.list_events(str(ExecutionId.generate()))


def test_list_responses_pages_and_max_seq():
    wf = create_workflow(now=T0)
    assert store.list_responses(wf) == ([], 0)
    kids = submit_children(wf, "n:js", 5, now=T0)
    for i, kid in enumerate(kids):
        finish(kid, Ok(i), now=at(i))
    all_responses, max_seq = store.list_responses(wf, limit=None)
    assert [r.seq for r in all_responses] == [1, 2, 3, 4, 5] and max_seq == 5
    assert [r.child_retval for r in all_responses] == [Ok(i) for i in range(5)]
    pages, after = [], 0
    while True:
        page, max_seq = store.list_responses(wf, after_seq=after, limit=2)
        assert max_seq == 5
        if not page:
            break
        pages.append([r.seq for r in page])
        after = page[-1].seq
    assert pages == [[1, 2], [3, 4], [5]]
    assert store.list_responses(wf, after_seq=3, limit=100)[0] == all_responses[3:]


# ---------------------------------------------------------------------------------------
# Reads (spec 000 §7.3 get, get_execution_event, get_last_execution_event, wait_for_finished_result)
# ---------------------------------------------------------------------------------------


def test_get_returns_events_responses_and_state_consistently():
    wf, locked, js, child = blocked_workflow(T0)
    finish(child, Ok("done"), now=at(4))
    log = store.get(wf)
    state = row(wf)
    assert log.state == store.ExecutionSnapshot.of(state)
    # A read hands out a frozen value, not a model a caller could save around the store.
    assert not hasattr(log.state, "save")
    with pytest.raises(dataclasses.FrozenInstanceError):
        log.state.state = "finished"
    assert (log.state.state, log.state.pending_expires_finished) == ("pending_at", at(10))
    assert log.next_version == state.next_version == 5
    assert [e.version for e in log.events] == list(range(5))
    assert [type(e.event).__name__ for e in log.events] == [
        "Created", "Locked", "HistoryEventRecord", "HistoryEventRecord", "HistoryEventRecord",
    ]  # fmt: skip
    assert log.events == store.list_events(wf)[0]
    assert log.responses == store.list_responses(wf)[0]
    assert [r.child_retval for r in log.responses] == [Ok("done")]
    assert log.events[1].event.run_id == locked.locked.run_id
    with pytest.raises(errors.NotFound):
        store.get(str(ExecutionId.generate()))


def test_get_event_and_get_last_event():
    execution_id = create(now=T0)
    store.append(execution_id, 1, persist(), now=at(1))
    store.append(execution_id, 2, Finished(retval=Err("bad")), now=at(2))
    created = store.get_event(execution_id, 0)
    assert (created.version, created.created_at, created.event.ffqn) == (0, T0, FFQN)
    middle = store.get_event(execution_id, 1)
    assert (middle.version, middle.created_at, middle.event.event.value) == (1, at(1), [4, 2])
    last = store.get_last_event(execution_id)
    assert last == store.get_event(execution_id, 2)
    assert (last.version, last.created_at, last.event.retval) == (2, at(2), Err("bad"))
    with pytest.raises(errors.NotFound):
        store.get_event(execution_id, 3)
    with pytest.raises(errors.NotFound):
        store.get_last_event(str(ExecutionId.generate()))


def test_get_finished_result_is_none_until_finished():
    execution_id = create(now=T0)
    assert store.get_finished_result(execution_id) is None
    locked = lock(execution_id, now=T0)
    assert store.get_finished_result(execution_id) is None
    store.append(execution_id, locked.next_version, Finished(retval=Ok([1, 2])), fence=locked.fence, now=at(1))
    assert store.get_finished_result(execution_id) == Ok([1, 2])
    with pytest.raises(errors.NotFound):
        store.get_finished_result(str(ExecutionId.generate()))


def test_wait_for_finished_result_times_out_or_returns_the_value():
    running = create(now=T0)
    with pytest.raises(errors.Timeout):
        store.wait_for_finished_result(running, timeout=0.2)
    done = create(now=T0)
    finish(done, Err({"code": 7}), now=at(1))
    assert store.wait_for_finished_result(done, timeout=0.2) == Err({"code": 7})
    with pytest.raises(errors.NotFound):
        store.wait_for_finished_result(str(ExecutionId.generate()), timeout=0.2)
