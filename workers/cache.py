"""The database cache for django-q2's cluster statistics, resilient to database restarts.

django-q2's sentinel saves its statistics to Django's cache every guard cycle (the
database cache here, so every process and the admin see every cluster). The sentinel has
no request cycle, so after a PostgreSQL restart its connection stays broken and every save
logs "the connection is closed" until the cluster stops. This cache drops a broken
connection and tries once more, so statistics resume with the database.
"""

from __future__ import annotations

import functools

from django.core.cache.backends.db import DatabaseCache
from django.db import connections, router

from executions.outage import DATABASE_ERRORS


def _reconnecting(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except DATABASE_ERRORS:
            alias = router.db_for_write(self.cache_model_class)
            connections[alias].close()
            return method(self, *args, **kwargs)

    return wrapper


class ResilientDatabaseCache(DatabaseCache):
    get = _reconnecting(DatabaseCache.get)
    get_many = _reconnecting(DatabaseCache.get_many)
    set = _reconnecting(DatabaseCache.set)
    add = _reconnecting(DatabaseCache.add)
    touch = _reconnecting(DatabaseCache.touch)
    delete = _reconnecting(DatabaseCache.delete)
    delete_many = _reconnecting(DatabaseCache.delete_many)
    has_key = _reconnecting(DatabaseCache.has_key)
    clear = _reconnecting(DatabaseCache.clear)
