"""Retention of finished executions: the hourly django-q2 schedule and the function it runs.

``python manage.py obelisk_retention --schedule`` creates (or updates) one django-q2
``Schedule`` named ``obelisk_retention`` that calls ``run_retention`` every hour in a worker
of any cluster. It deletes, in short batches (``store.delete_finished``), the trees of
top-level executions that finished longer ago than ``OBELISK['RETENTION']`` (or the
``older_than_seconds`` the schedule was given), and stops starting batches after
``MAX_SECONDS_PER_RUN``, well inside the cluster's task timeout; the next hour goes on.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.utils import timezone

from executions import conf, errors, store

logger = logging.getLogger("obelisk.retention")

SCHEDULE_NAME = "obelisk_retention"
SCHEDULE_FUNC = "workers.retention.run_retention"
MAX_SECONDS_PER_RUN = 600  # the cluster's task timeout (Q_CLUSTER["timeout"]) is 3000 s


def configured_retention() -> timedelta | None:
    """``OBELISK['RETENTION']``: a positive ``timedelta``, or None (keep forever)."""
    value = conf.get("RETENTION")
    if value is None:
        return None
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise errors.ValidationFailed(
            f"OBELISK['RETENTION'] must be a positive timedelta or None, got {errors.excerpt(value)}"
        )
    return value


def configured_batch_size() -> int:
    return conf.get("RETENTION_BATCH_SIZE")


def run_retention(older_than_seconds: float | None = None) -> int:
    """The scheduled task: delete what finished longer ago than ``older_than_seconds``, or
    than the ``RETENTION`` setting; nothing when neither is set. Returns how many
    executions it deleted."""
    retention = timedelta(seconds=older_than_seconds) if older_than_seconds is not None else configured_retention()
    if retention is None:
        return 0
    cutoff = timezone.now() - retention
    deleted = store.delete_finished(cutoff, batch_size=configured_batch_size(), max_seconds=MAX_SECONDS_PER_RUN)
    logger.info("retention: deleted %d execution(s) finished before %s", deleted, cutoff.isoformat(timespec="seconds"))
    return deleted


def ensure_schedule(older_than_seconds: int | None = None) -> bool:
    """Create or update the hourly schedule; returns True when it was created. With
    ``older_than_seconds`` the schedule keeps that retention, without it follows the
    setting. An existing schedule keeps its next run time."""
    from django_q.models import Schedule

    kwargs = None if older_than_seconds is None else f"older_than_seconds={int(older_than_seconds)}"
    fields = {"func": SCHEDULE_FUNC, "schedule_type": Schedule.HOURLY, "repeats": -1, "args": None, "kwargs": kwargs}
    updated = Schedule.objects.filter(name=SCHEDULE_NAME).update(**fields)
    if updated:
        return False
    Schedule.objects.create(name=SCHEDULE_NAME, next_run=timezone.now(), **fields)
    return True
