"""The store's models are read-only outside the store (issue 37, item 3).

``Model.objects`` (the default manager, the admin's and every caller's) refuses writes;
``filter_executions`` hands out such a queryset; the store writes through
``store_objects`` and keeps working.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from executions import store
from executions.models import (
    AuditEntry,
    Delay,
    ExecutionEvent,
    ExecutionState,
    LogEntry,
    ReadOnly,
)
from tests.support.helpers import create

pytestmark = pytest.mark.django_db(transaction=True)


def test_writes_through_the_default_manager_raise():
    execution_id = create()
    rows = ExecutionState.objects.filter(pk=execution_id)
    with pytest.raises(ReadOnly):
        rows.update(ffqn="changed/outside.store")
    with pytest.raises(ReadOnly):
        rows.delete()
    with pytest.raises(ReadOnly):
        ExecutionEvent.objects.filter(execution_id=execution_id).delete()
    with pytest.raises(ReadOnly):
        AuditEntry.objects.create(action="cancel", execution_id=execution_id)
    with pytest.raises(ReadOnly):
        LogEntry.objects.bulk_create([])
    with pytest.raises(ReadOnly):
        Delay.objects.get_or_create(delay_id="x")
    with pytest.raises(ReadOnly):
        ExecutionState.objects.update_or_create(pk=execution_id, defaults={"ffqn": "x/y.z"})
    row = ExecutionState.objects.get(pk=execution_id)  # reads still work
    assert row.ffqn == store.get_state(execution_id).ffqn
    assert ExecutionEvent.objects.filter(execution_id=execution_id).count() == 1


def test_filter_executions_hands_out_a_read_only_queryset():
    execution_id = create()
    rows = store.filter_executions(store.ExecutionFilter())
    assert execution_id in set(rows.values_list("execution_id", flat=True))
    with pytest.raises(ReadOnly):
        rows.update(ffqn="changed/outside.store")
    with pytest.raises(ReadOnly):
        rows.filter(pk=execution_id).delete()
    assert ExecutionState.objects.filter(pk=execution_id).exists()


def test_the_store_still_writes():
    execution_id = create()
    with store.audited("cancel", execution_id, actor="tester", via="admin"):
        store.cancel(execution_id, now=timezone.now())
    assert ExecutionState.objects.get(pk=execution_id).corresponding_version > 0
    assert AuditEntry.objects.filter(execution_id=execution_id, action="cancel").exists()
    assert ExecutionState.store_objects.filter(pk=execution_id).exists()
