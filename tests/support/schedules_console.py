"""Schedules in the states an operator looks at, for the console's tests (issue 39).

Made through ``executions.schedules`` and the store's sweep (``fire_due_schedules`` at
chosen ``now`` values ahead of the clock), as the timer sweep would make them:

- ``sync``: every 10 s, overlap ``skip``; its first tick's execution finished ok, the
  second one started and is still scheduled (created ahead of the clock), ticks skipped
  while it ran, older ones missed (outside the 30 s catch-up window);
- ``nightly``: cron ``30 2 * * *`` in Europe/Prague, three nights backfilled;
- ``broken``: a target whose arguments no longer fit (as after a deploy that changed the
  function): its tick failed and it is paused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from executions import schedules, store
from executions.events import Finished, Ok
from executions.models import Schedule
from tests.support import helpers

ADD = "test:acts/basic.add"


@dataclass(frozen=True)
class Schedules:
    sync: str
    nightly: str
    broken: str
    ok_execution: str  # the tick of ``sync`` that finished ok
    scheduled_execution: str  # the tick of ``sync`` still waiting


def fire(now):
    return store.fire_due_schedules(schedules.prepare_tick, now=now)


def _save(request: schedules.ScheduleRequest, now) -> Schedule:
    row, _ = store.save_schedule(request.definition(), mode="create", now=now)
    return row


def make_schedules() -> Schedules:
    helpers.deploy_components()
    t0 = timezone.now().replace(microsecond=0)
    sync = _save(schedules.ScheduleRequest("sync", ADD, [1, 2], interval_seconds=10, catchup_window_seconds=30), t0)
    broken = _save(schedules.ScheduleRequest("broken", ADD, [3, 4], interval_seconds=60), t0)
    # A deploy changed the function under ``broken``: its arguments no longer fit. (The
    # only way to that state without a second deployment of other code.)
    Schedule.store_objects.filter(schedule_id="broken").update(arguments=["one", "two"])
    schedules.create(
        schedules.ScheduleRequest(
            "nightly", ADD, [5, 6], cron="30 2 * * *", timezone="Europe/Prague", overlap="buffer_one"
        )
    )
    schedules.backfill("nightly", t0 - timedelta(days=3), t0)

    first_tick = sync.next_tick_at
    fire(first_tick)  # sync started (broken fails at its first tick, within the calls here)
    ok_execution = Schedule.objects.get(schedule_id="sync").running_execution_id
    fire(first_tick + timedelta(seconds=10))  # skipped: the first has not finished
    locked = helpers.lock(ok_execution, now=first_tick + timedelta(seconds=15))
    store.append(ok_execution, None, Finished(retval=Ok(3)), fence=locked.fence, now=first_tick + timedelta(seconds=16))
    fire(first_tick + timedelta(seconds=20))  # started; it waits for a worker
    scheduled_execution = Schedule.objects.get(schedule_id="sync").running_execution_id
    fire(first_tick + timedelta(seconds=90))  # sync: a missed tick, then skipped ones
    assert Schedule.objects.get(schedule_id=broken.schedule_id).paused
    return Schedules(
        sync="sync",
        nightly="nightly",
        broken="broken",
        ok_execution=ok_execution,
        scheduled_execution=scheduled_execution,
    )
