"""Retention (issue 13 item 3): ``store.delete_finished`` and ``obelisk_retention`` delete
top-level executions that finished before a cutoff, each with its whole tree and everything
that belongs to it, in short batches that never wait for a row lock; anything unfinished,
recent or locked is kept whole.

Executions are built through the store API with explicit times; the store function takes
its cutoff as an argument, so those tests do not depend on the wall clock. The command
computes its cutoff from the wall clock, so its tests finish executions 40 days ago.
Transactional: the lock test needs a second connection, the command tests other processes.
"""

from __future__ import annotations

import ast
import io
import threading
import time
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from executions import errors, store
from executions.events import (
    DelayRequest,
    Finished,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
)
from executions.ids import DelayId, ExecutionId, JoinSetId, new_run_id
from executions.management.commands import _cli
from executions.models import Backtrace, ExecutionBacktrace, ExecutionState
from tests.support import helpers
from tests.support.clusters import WorkerCluster, wait_until
from tests.support.helpers import ACTIVITY, FFQN, T0, WORKFLOW, WORKFLOW_FFQN, history, start_child
from tests.support.processes import refused, run
from workers import retention
from workers.testing import submit

pytestmark = pytest.mark.django_db(transaction=True)

SAFETY_TIMEOUT = 60  # seconds; only ever hit when something hangs
BACKTRACE_HASH = "01" + "ab" * 32


def at(seconds: float):
    return T0 + timedelta(seconds=seconds)


# ---------------------------------------------------------------------------------------
# Building trees through the store
# ---------------------------------------------------------------------------------------


def finish(execution_id: str, *, now) -> None:
    store.append(execution_id, store.get_state(execution_id).next_version, Finished(retval=Ok(None)), now=now)


def submit_child(parent: str, js: str, *, workflow: bool = False, now) -> str:
    """``parent`` opens join set ``js`` and starts one child in it (the store writes both)."""
    ffqn, component = (WORKFLOW_FFQN, WORKFLOW) if workflow else (FFQN, ACTIVITY)
    child, _ = start_child(parent, js, store.get_state(parent).next_version, ffqn=ffqn, component=component, now=now)
    return child


def request_delay(execution_id: str, js: str, *, expires_at, now) -> str:
    delay_id = str(DelayId(ExecutionId.parse(execution_id), JoinSetId.parse(js), 1))
    store.append_batch(
        execution_id,
        store.get_state(execution_id).next_version,
        [
            history(JoinSetCreate(join_set_id=js)),
            history(JoinSetRequest(join_set_id=js, request=DelayRequest(delay_id=delay_id, expires_at=expires_at))),
        ],
        now=now,
    )
    return delay_id


def add_logs_and_backtrace(execution_id: str, *, now) -> None:
    store.append_logs(execution_id, new_run_id(), entries=[(now, 3, "hello")], streams=[(now, 1, b"out")])
    # A worker stores a blocked workflow's stack as a best-effort side record: written here
    # directly, with a hash every tree shares (t_backtrace is content-addressed).
    Backtrace.store_objects.get_or_create(backtrace_hash=BACKTRACE_HASH, defaults={"frames": [{"line": 1}]})
    ExecutionBacktrace.store_objects.create(
        execution_id=execution_id,
        component_id={"name": "test"},
        version_min_including=1,
        version_max_excluding=2,
        backtrace_id=BACKTRACE_HASH,
    )


def full_tree(*, created, finished=None) -> list[str]:
    """A workflow -> child workflow -> grandchild activity, with a fired delay (a delay
    response), a delay never fired (a ``t_delay`` row), logs and backtraces; every execution
    finished at ``finished`` (unless None). Returns the ids, top-level first."""
    wf = helpers.create_workflow(now=created)
    child = submit_child(wf, "n:kids", workflow=True, now=created)
    grandchild = submit_child(child, "n:inner", now=created)
    fired = request_delay(wf, "n:sleep", expires_at=created + timedelta(seconds=1), now=created)
    assert store.fire_delay(fired, now=created + timedelta(seconds=1)) is store.DelayOutcome.DELIVERED
    request_delay(child, "n:later", expires_at=created + timedelta(days=365), now=created)
    for execution_id in (wf, child, grandchild):
        add_logs_and_backtrace(execution_id, now=created)
    if finished is not None:
        for execution_id in (grandchild, child, wf):  # each child's response reaches its parent
            finish(execution_id, now=finished)
    return [wf, child, grandchild]


def finished_activity(*, created, finished) -> str:
    execution_id = helpers.create(now=created)
    finish(execution_id, now=finished)
    return execution_id


def rows_of(ids: list[str]) -> dict[str, int]:
    """How many rows reference ``ids`` in every table with a foreign key to ``t_state``,
    and in ``t_state`` itself (found from the models, so a new table is covered too)."""
    counts = {"t_state": ExecutionState.objects.filter(pk__in=ids).count()}
    for relation in ExecutionState._meta.related_objects:
        model = relation.related_model
        key = f"{model._meta.db_table}.{relation.field.column}"
        counts[key] = model.objects.filter(**{f"{relation.field.name}__in": ids}).count()
    return counts


def existing(ids: list[str]) -> set[str]:
    return set(ExecutionState.objects.filter(pk__in=ids).values_list("pk", flat=True))


# ---------------------------------------------------------------------------------------
# The store function
# ---------------------------------------------------------------------------------------


def test_retention_deletes_old_finished_trees_with_everything_that_belongs_to_them():
    old = full_tree(created=T0, finished=at(10))
    other_old = finished_activity(created=T0, finished=at(20))
    recent = full_tree(created=T0, finished=at(7200))
    before = rows_of(old)
    # every kind of row is there to be deleted (delays: the unfired one; responses: the
    # child's, the grandchild's and the fired delay's, counted as parent and as child)
    assert all(count > 0 for count in before.values()), before
    kept_before = rows_of(recent)

    assert store.delete_finished(at(3600)) == len(old) + 1

    assert set(rows_of(old).values()) == {0}
    assert not existing([other_old])
    assert rows_of(recent) == kept_before
    # t_backtrace is shared and content-addressed: left alone
    assert Backtrace.objects.filter(backtrace_hash=BACKTRACE_HASH).exists()
    assert [state.execution_id for state, _ in store.get_tree(recent[0])] == sorted(recent)


def test_retention_keeps_unfinished_trees_and_recent_ones():
    # the parent finished long ago, its child still runs: the whole tree stays
    parent = helpers.create_workflow(now=T0)
    running_child = submit_child(parent, "n:kids", now=T0)
    finish(parent, now=at(10))
    # a tree whose grandchild never finished (its parents finished regardless)
    unfinished_deep = full_tree(created=T0)
    for execution_id in unfinished_deep[:2]:
        finish(execution_id, now=at(10))
    # never finished; finished after the cutoff; finished exactly at the cutoff
    pending = helpers.create(now=T0)
    recent = finished_activity(created=T0, finished=at(7200))
    at_cutoff = finished_activity(created=T0, finished=at(3600))
    # a finished child of a running parent is not a candidate: its parent is kept
    blocked_parent = helpers.create_workflow(now=T0)
    finished_child = submit_child(blocked_parent, "n:kids", now=T0)
    finish(finished_child, now=at(10))
    deleted = full_tree(created=T0, finished=at(10))
    kept = [parent, running_child, *unfinished_deep, pending, recent, at_cutoff, blocked_parent, finished_child]
    kept_rows = rows_of(kept)

    assert store.delete_finished(at(3600)) == len(deleted)

    assert not existing(deleted)
    assert existing(kept) == set(kept)
    assert rows_of(kept) == kept_rows
    # once the last execution of a kept tree finishes, a later run takes the whole tree
    finish(running_child, now=at(20))
    assert store.delete_finished(at(3600)) == 2
    assert not existing([parent, running_child])


def test_retention_works_in_batches_oldest_first_and_a_kept_tree_does_not_stop_it():
    # the oldest tree is kept (its child runs), so every batch must look past it
    blocker = helpers.create_workflow(now=T0)
    blocker_child = submit_child(blocker, "n:kids", now=T0)
    finish(blocker, now=at(10))
    trees = [full_tree(created=at(i), finished=at(100)) for i in range(1, 6)]
    singles = [finished_activity(created=at(10 + i), finished=at(100)) for i in range(3)]
    snapshot = helpers.db_snapshot()

    expected = sum(len(tree) for tree in trees) + len(singles)
    assert store.delete_finished(at(3600), batch_size=2, dry_run=True) == expected
    assert helpers.db_snapshot() == snapshot, "a dry run wrote something"

    # two batches of two top-level executions: the blocker and the oldest three trees seen
    deleted = store.delete_finished(at(3600), batch_size=2, max_batches=2)
    assert deleted == 3 * 3
    assert not existing([i for tree in trees[:3] for i in tree])
    assert existing([i for tree in trees[3:] for i in tree] + singles + [blocker])

    assert store.delete_finished(at(3600), batch_size=2) == 2 * 3 + len(singles)
    assert set(ExecutionState.objects.values_list("pk", flat=True)) == {blocker, blocker_child}
    assert store.delete_finished(at(3600), batch_size=2) == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"batch_size": 0}, {"batch_size": 10_001}, {"max_batches": 0}],
    ids=["batch-0", "batch-too-large", "max-batches-0"],
)
def test_retention_refuses_bad_batch_limits_before_deleting_anything(kwargs):
    finished_activity(created=T0, finished=at(10))
    snapshot = helpers.db_snapshot()
    with pytest.raises(errors.ValidationFailed):
        store.delete_finished(at(3600), **kwargs)
    assert helpers.db_snapshot() == snapshot


def test_retention_refuses_a_naive_cutoff():
    with pytest.raises(errors.ValidationFailed):
        store.delete_finished(T0.replace(tzinfo=None))


@pytest.mark.postgres_only
def test_retention_never_waits_for_a_locked_row():
    """Rows another transaction holds (a root, or a child of a tree) are skipped without
    waiting, and their whole tree is kept; everything else goes. ``lock_timeout`` turns a
    wait into an error instead of a hang."""
    root_locked = full_tree(created=T0, finished=at(10))
    child_locked = full_tree(created=T0, finished=at(10))
    free = full_tree(created=T0, finished=at(10))
    held, release = threading.Event(), threading.Event()
    failures = []

    def holder():
        try:
            with transaction.atomic():
                rows = [root_locked[0], child_locked[2]]
                list(ExecutionState.objects.select_for_update().filter(pk__in=rows).values_list("pk"))
                held.set()
                release.wait(SAFETY_TIMEOUT)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test's thread
            failures.append(error)
        finally:
            held.set()
            connection.close()

    thread = threading.Thread(target=holder, daemon=True)
    thread.start()
    try:
        assert held.wait(SAFETY_TIMEOUT) and not failures
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        started = time.monotonic()
        deleted = store.delete_finished(at(3600), batch_size=1)
        elapsed = time.monotonic() - started
    finally:
        release.set()
        thread.join(SAFETY_TIMEOUT)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert not failures and not thread.is_alive()
    assert elapsed < 5, f"retention waited {elapsed:.1f} s for a row lock"
    assert deleted == len(free)
    assert not existing(free)
    assert existing(root_locked + child_locked) == set(root_locked + child_locked)
    # released: the next run takes them
    assert store.delete_finished(at(3600)) == len(root_locked) + len(child_locked)
    assert not ExecutionState.objects.exists()


# ---------------------------------------------------------------------------------------
# The command and the schedule
# ---------------------------------------------------------------------------------------


def old_and_recent() -> tuple[list[str], str]:
    """A tree that finished 40 days ago and an activity that finished just now."""
    long_ago = timezone.now() - timedelta(days=40)
    old = full_tree(created=long_ago, finished=long_ago + timedelta(seconds=1))
    recent = finished_activity(created=timezone.now(), finished=timezone.now())
    return old, recent


def test_retention_command_counts_with_dry_run_then_deletes_what_finished_before_older_than():
    old, recent = old_and_recent()
    snapshot = helpers.db_snapshot()

    result = run("obelisk_retention", "--older-than", "30d", "--dry-run")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.decode().startswith(f"would delete {len(old)} execution(s) finished before ")
    assert helpers.db_snapshot() == snapshot

    result = run("obelisk_retention", "--older-than", "720h", "--batch-size", "1")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stderr == b""
    assert result.stdout.decode().startswith(f"deleted {len(old)} execution(s) finished before ")
    assert not existing(old)
    assert existing([recent]) == {recent}


@pytest.mark.parametrize(
    "argv",
    [
        ("--older-than", "30"),
        ("--older-than", "1.5h"),
        ("--older-than=-1d",),
        ("--older-than", "0s"),
        ("--older-than", "99999999d"),
        ("--older-than", "30d", "--batch-size", "0"),
        (),  # neither --older-than nor the setting
    ],
    ids=["no-unit", "fraction", "negative", "zero", "over-100-years", "batch-size-0", "no-retention"],
)
def test_retention_command_refuses_bad_input_in_one_line_with_the_database_unchanged(argv):
    old_and_recent()
    line = refused("obelisk_retention", *argv, code="validation_failed")
    if argv and argv[0].startswith("--older-than") and len(argv) <= 2:
        assert argv[-1].removeprefix("--older-than=") in line


def test_retention_command_with_a_malformed_command_line_is_a_usage_error():
    old_and_recent()
    refused("obelisk_retention", "--older-than", code="usage_error", status=_cli.EXIT_USAGE)
    refused(
        "obelisk_retention",
        "--schedule",
        "--dry-run",
        "--older-than",
        "30d",
        code="usage_error",
        status=_cli.EXIT_USAGE,
    )


def test_retention_command_defaults_to_the_retention_setting():
    old, recent = old_and_recent()
    settings = {"COMPONENT_MODULES": ["tests.support.components"], "RETENTION": timedelta(days=30)}
    with override_settings(OBELISK=settings):
        out = io.StringIO()
        call_command("obelisk_retention", stdout=out)
    assert out.getvalue().startswith(f"deleted {len(old)} execution(s) finished before ")
    assert not existing(old) and existing([recent]) == {recent}
    with override_settings(OBELISK={**settings, "RETENTION": "30 days"}):
        with pytest.raises(CommandError, match="^validation_failed: OBELISK\\['RETENTION'\\] must be a positive"):
            call_command("obelisk_retention", stdout=io.StringIO())


def test_retention_schedule_is_one_hourly_django_q_schedule_that_runs_the_retention():
    from django_q.models import Schedule

    old, recent = old_and_recent()
    result = run("obelisk_retention", "--schedule", "--older-than", "30d")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    assert result.stdout.decode() == (
        "created hourly schedule obelisk_retention: workers.retention.run_retention, older than 30d\n"
    )
    assert existing(old) == set(old), "--schedule deleted something itself"
    result = run("obelisk_retention", "--schedule", "--older-than", "7d")
    assert result.stdout.decode().startswith("updated hourly schedule obelisk_retention: ")
    (schedule,) = Schedule.objects.filter(name=retention.SCHEDULE_NAME)
    assert (schedule.func, schedule.schedule_type, schedule.repeats) == (
        "workers.retention.run_retention",
        Schedule.HOURLY,
        -1,
    )
    # django-q2's scheduler reads `kwargs` as keyword-argument syntax
    call = ast.parse(f"f({schedule.kwargs})").body[0].value
    kwargs = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}
    assert kwargs == {"older_than_seconds": 7 * 86400}
    assert retention.run_retention(**kwargs) == len(old)
    assert not existing(old) and existing([recent]) == {recent}


def test_scheduled_retention_follows_the_setting_and_does_nothing_without_it():
    old, _ = old_and_recent()
    assert retention.run_retention() == 0
    assert existing(old) == set(old)
    settings = {"COMPONENT_MODULES": ["tests.support.components"], "RETENTION": timedelta(days=30)}
    with override_settings(OBELISK=settings):
        assert retention.run_retention() == len(old)
    assert not existing(old)


def test_retention_command_help_shows_the_exit_statuses():
    from workers.management.commands import obelisk_retention

    text = " ".join(obelisk_retention.Command().create_parser("manage.py", "obelisk_retention").format_help().split())
    assert "--older-than" in text and "--dry-run" in text and "--schedule" in text
    assert "Errors are one line on stderr" in text


@pytest.mark.slow
def test_the_hourly_schedule_runs_the_retention_in_a_real_worker_cluster_next_to_activities(tmp_path):
    """End to end: ``--schedule`` makes a django-q2 schedule that a running ``obelisk_worker``
    picks up (its scheduler looks every 15 s) and runs through the ORM queue, while the same
    cluster goes on running activities."""
    old, recent = old_and_recent()
    result = run("obelisk_retention", "--schedule", "--older-than", "30d")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    cluster = WorkerCluster(tmp_path / "worker.log", workers=1).start()
    try:
        execution_id, _ = submit("test:acts/basic.add", [1, 2])
        assert store.wait_for_finished_result(execution_id, timeout=SAFETY_TIMEOUT) == Ok(3)
        wait_until(lambda: not existing(old), timeout=SAFETY_TIMEOUT, interval=0.5, what="the scheduled retention")
    finally:
        cluster.stop()
    assert existing([recent, execution_id]) == {recent, execution_id}
