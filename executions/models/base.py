"""What every table of the store shares: exact JSON text, and read-only default managers.

The store (``executions.store``) is the one writer of every table; elsewhere a model's
``objects`` reads only and refuses writes, as procrastinate's Django models do.
"""

import json

from django.db import models

from executions.events import compact_json

__all__ = [
    "COMPONENT_TYPES",
    "ExactJSONField",
    "ReadOnly",
    "ReadOnlyManager",
    "ReadOnlyQuerySet",
    "StoreTable",
    "choices",
]

COMPONENT_TYPES = ["activity", "activity_stub", "workflow", "webhook_endpoint", "cron"]


class ExactJSONField(models.TextField):
    """JSON kept as the exact text it was written as (decision 15; decisions.md D25).

    PostgreSQL's ``jsonb`` rewrites numbers (``1e16`` reads back as an integer, ``-0.0`` as
    ``0.0``), so an identical resubmission would conflict and code would receive other
    values than were sent. Upstream's PostgreSQL store uses ``json``, which keeps the text;
    so does this field (``text`` on SQLite). Values are checked by the store before they
    get here (``events.check_storable``).
    """

    description = "JSON stored as its exact text"

    def db_type(self, connection):
        return "json" if connection.vendor == "postgresql" else "text"

    def from_db_value(self, value, expression, connection):
        return None if value is None else json.loads(value)

    def get_prep_value(self, value):
        if value is None:
            return None
        return compact_json(value)


class ReadOnly(Exception):
    """A write to an execution table outside ``executions.store``."""


class ReadOnlyQuerySet(models.QuerySet):
    """A queryset that reads only: the store is the only writer of these tables, so a
    write through ``Model.objects`` (``update``, ``delete``, ``create``…) raises ``ReadOnly``
    (as procrastinate's Django models do). The store writes through ``store_objects``."""

    def _refuse(self, *args, **kwargs):
        raise ReadOnly(f"{self.model.__name__} is read-only outside executions.store; write through the store")

    update = delete = create = bulk_create = bulk_update = _refuse
    get_or_create = update_or_create = _refuse


class ReadOnlyManager(models.Manager.from_queryset(ReadOnlyQuerySet)):
    """The default manager of the store's models: reads only (``ReadOnlyQuerySet``)."""


class StoreTable(models.Model):
    """A table of the store: ``objects`` reads (the default manager, also the admin's);
    ``store_objects`` writes, and only ``executions.store`` uses it."""

    objects = ReadOnlyManager()
    store_objects = models.Manager()

    class Meta:
        abstract = True


def choices(values):
    return [(value, value) for value in values]
