"""Creates and notifications on the hot path (decisions D17, D45, D48, D56).

A plain ``create`` on PostgreSQL is one message and stays idempotent; a listener is woken
only once the rows are visible; a process hears each of its own commits once and LISTENs
only on the channels asked for, missing nothing on a new one; a waiting client takes a
short result from its notification and reads a long one back, exactly; an engine setting
read once follows a change (D83). On PostgreSQL and SQLite unless marked.

why: D45, D48, D56
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from executions import conf, errors, notify, store
from executions.events import Ok
from executions.models import ExecutionEvent, ExecutionState
from tests.support.helpers import FFQN, another_session, create
from tests.support.hot_path import finish

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_plain_create_is_idempotent_and_refuses_another_call_under_the_same_id():
    """Decision 13 holds on the one-message path: the same call again reports the existing
    execution; another call under the same id is a conflict and changes nothing."""
    assert not connection.in_atomic_block  # the path under test: no surrounding transaction
    execution_id = create(params=[1])
    again = store.create(
        store.CreateRequest(
            execution_id=execution_id,
            ffqn=FFQN,
            params=[1],
            component_id=store.get_created(execution_id).component_id,
            deployment_id=store.get_state(execution_id).deployment_id,
        )
    )
    assert again.already_existed
    with pytest.raises(errors.Conflict):
        create(params=[2], execution_id=execution_id)
    assert ExecutionEvent.objects.filter(execution_id=execution_id).count() == 1
    assert store.get_created(execution_id).params == [1]


def test_a_plain_create_wakes_a_listener_only_once_its_rows_are_visible():
    """The rows and the notification commit together: whoever is woken finds the new
    execution pending (a listener of this process is woken after the commit, not before)."""
    with notify.Listener([notify.PENDING]) as listener:
        execution_id = create()
        notes = listener.wait(5.0)
    assert any(FFQN in note.items for note in notes)
    assert ExecutionState.objects.get(pk=execution_id).state == "pending_at"


@pytest.mark.postgres_only
def test_a_commit_wakes_a_listener_of_its_own_process_once():
    """D45: a commit of this process wakes its listeners at commit; the server's echo of the
    same NOTIFY is not delivered a second time. A commit of another session still is."""
    with notify.Listener([notify.PENDING]) as listener:
        create()
        deadline = time.monotonic() + 1.0  # the echo, if delivered, arrives within this
        received = []
        while (left := deadline - time.monotonic()) > 0:
            received.extend(listener.wait(left))
        assert len(received) == 1

        with another_session() as other:
            other.execute("SELECT pg_notify(%s, %s)", [notify.PENDING, "other:pkg/ifc.fn"])
        notes = listener.wait(5.0)
    assert [note.items for note in notes] == [("other:pkg/ifc.fn",)]


def _notify_from_another_session(channel: str, payload: str) -> None:
    with another_session() as other:
        other.execute("SELECT pg_notify(%s, %s)", [channel, payload])


@pytest.mark.postgres_only
def test_a_process_listens_only_on_the_channels_asked_for_and_a_new_channel_misses_nothing():
    """D56: a process's LISTEN session covers the channels its listeners asked for, so a
    client waiting for results is not woken by every new pending execution. A listener
    for a channel not covered yet returns only once it is, and hears a commit made by
    another process right after it subscribed."""
    notify.stop_listening()  # a fresh session for this process
    with notify.Listener([notify.FINISHED]) as results:
        assert notify.listening_channels() == {notify.FINISHED}
        with notify.Listener([notify.PENDING]) as pending:
            assert notify.listening_channels() == {notify.FINISHED, notify.PENDING}
            _notify_from_another_session(notify.PENDING, "other:pkg/ifc.fn")
            assert {note.items for note in pending.wait(5.0)} == {("other:pkg/ifc.fn",)}
        # (while the session is replaced, a notification may come twice: harmless, D56)
        _notify_from_another_session(notify.FINISHED, "E_01KBZZZZZZZZZZZZZZZZZZZZZZ")
        assert {note.items for note in results.wait(5.0)} == {("E_01KBZZZZZZZZZZZZZZZZZZZZZZ",)}


@pytest.mark.parametrize("size", [10, 5000], ids=["short_result", "long_result"])
def test_a_waiting_client_gets_the_exact_result_whether_it_rides_the_notification_or_not(size):
    """D48: a short return value comes with the ``obelisk_finished`` notification, a long
    one (over 1,000 characters of JSON) is read back; the waiter returns the same either way,
    also for several executions finishing while it waits."""
    ids = [create() for _ in range(3)]
    values = {execution_id: {"n": index, "text": "é" * size} for index, execution_id in enumerate(ids)}

    def finish_later() -> None:
        time.sleep(0.2)
        for execution_id, value in values.items():
            finish(execution_id, value)
        connection.close()

    finisher = threading.Thread(target=finish_later)
    finisher.start()
    try:
        results = store.wait_for_finished(ids, timeout=30)
    finally:
        finisher.join()
    assert results == {execution_id: Ok(value) for execution_id, value in values.items()}


def test_finished_notifications_carry_only_short_results():
    """The notification item is the id, plus the value's JSON when it is short."""
    short = notify.finished_item("E_1", {"ok": [1, "a\tb\nc"]})
    assert "\n" not in short
    assert notify.parse_finished_item(short) == ("E_1", {"ok": [1, "a\tb\nc"]})
    long = notify.finished_item("E_1", {"ok": "x" * 2000})
    assert notify.parse_finished_item(long) == ("E_1", None)


def test_an_engine_setting_read_once_follows_a_change_of_the_setting_and_its_undoing():
    """``conf.get`` reads ``settings.OBELISK`` once (the hot path asks several times an
    execution), yet a change made by ``override_settings`` is seen at once, and so is its
    end."""
    default = conf.DEFAULTS["HAND_BACK_AFTER"]
    assert conf.get("HAND_BACK_AFTER") == default
    with override_settings(OBELISK={**settings.OBELISK, "HAND_BACK_AFTER": timedelta(seconds=7)}):
        assert conf.get("HAND_BACK_AFTER") == timedelta(seconds=7)
    assert conf.get("HAND_BACK_AFTER") == default


def test_waiting_for_an_unknown_execution_is_not_found_and_names_it():
    known = create()
    with pytest.raises(errors.NotFound, match="E_01"):
        store.wait_for_finished([known, "E_01JAAAAAAAAAAAAAAAAAAAAAAA"], timeout=1)
