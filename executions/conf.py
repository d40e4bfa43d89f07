"""Engine settings with their defaults: ``settings.OBELISK`` overrides any key."""

from datetime import timedelta

from django.conf import settings
from django.core.signals import setting_changed

DEFAULTS = {
    # Largest JSON payload (parameters, return value, any event) the store accepts.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Longest error detail (traceback) kept in a TemporarilyFailed event; longer is cut.
    "MAX_ERROR_DETAIL_CHARS": 16 * 1024,
    # Modules whose import registers activities (see workers.registry).
    "COMPONENT_MODULES": [],
    # Deepest nesting of a JSON payload the store accepts (decoders recurse).
    "MAX_JSON_DEPTH": 64,
    # A run longer than this hands back the unstarted rest of its claimed batch.
    "HAND_BACK_AFTER": timedelta(milliseconds=200),
    # A worker told of new activities while it ran its last batch (work streams in faster
    # than it claims) waits this long before it claims again, so that the stream is claimed
    # a few at a time, not one claim per execution (D86, D89). Zero: it claims at once.
    "CLAIM_COALESCE": timedelta(milliseconds=10),
    # A stopping worker lets a running execution finish this long, then hands it back.
    "SHUTDOWN_GRACE": timedelta(seconds=20),
    # After a database outage the sweep leaves expired locks alone this long, so live
    # workers renew their locks and write their results first.
    "OUTAGE_LOCK_GRACE": timedelta(seconds=5),
    # An Interrupt workflow run that blocks stays parked in its worker this long, holding a
    # thread and a connection but no lock, to go on at once if that worker claims it next
    # (D77). Zero: every run unwinds at once, and the next run replays.
    "PARKED_RUN_TIMEOUT": timedelta(seconds=10),
    # Where no LISTEN/NOTIFY exists (SQLite), waiters poll this often.
    "POLL_INTERVAL": timedelta(milliseconds=50),
    # The longest an API long poll (``GET …/wait``) blocks, whatever ``timeout`` it asked
    # for; it then answers ``finished: false`` and the client asks again. Below the WSGI
    # server's request timeout (gunicorn's sync worker: 30 s), so that the server never
    # kills a wait and answers HTML (D102).
    "MAX_WAIT": timedelta(seconds=25),
    # Long polls one server process serves at once; more are answered 429 with
    # ``Retry-After``. Keep it below the server's threads per process, so that other
    # requests always find a thread (D101).
    "MAX_WAITS_PER_PROCESS": 12,
    # Long polls one user has open at once in one server process; more are answered 429.
    "MAX_WAITS_PER_USER": 8,
    # Retention: finished top-level executions (with their whole trees and everything that
    # belongs to them) are deleted this long after they finished, by `obelisk_retention`
    # or its hourly schedule (a timedelta). None keeps them forever.
    "RETENTION": None,
    # Top-level executions deleted per retention transaction.
    "RETENTION_BATCH_SIZE": 1000,
}


_overrides: dict | None = None  # ``settings.OBELISK``, read once (until it changes)


def get(name: str):
    """A setting: ``settings.OBELISK[name]``, else its default. The hot path reads a few
    per execution, and every read of ``settings`` goes through ``LazySettings``; so the
    dict is read once, and again after ``setting_changed`` (``override_settings``), D83."""
    global _overrides
    if _overrides is None:
        _overrides = getattr(settings, "OBELISK", {})
    return _overrides.get(name, DEFAULTS[name])


def _forget_overrides(setting: str, **kwargs) -> None:
    global _overrides
    if setting == "OBELISK":
        _overrides = None


setting_changed.connect(_forget_overrides)


def q_cluster(workers: int = 2, **overrides) -> dict:
    """The ``Q_CLUSTER`` setting of a project that runs Obelisk worker clusters.

    ``workers`` is the number of worker processes per cluster (``obelisk_worker
    --workers`` overrides it); ``overrides`` replace or add django-q2 options, e.g.
    ``cache="obelisk"`` to keep cluster statistics in a cache other than ``default``.
    Use it in settings: ``Q_CLUSTER = q_cluster(workers=4)``. Django need not be set up.
    """
    cluster = {
        "name": "obelisk",
        "workers": workers,
        # The broker hands out claim tasks; the execution tables are the queue
        # (docs/architecture.md, "Workers").
        "broker_class": "workers.broker.ExecutionBroker",
        "orm": "default",
        # The execution tables are the source of truth; only failed batches are kept.
        "save_limit": -1,
        # Claim tasks are cheap; a short queue keeps claims close to a free worker.
        "queue_limit": workers * 2,
        "recycle": 100_000,
        "guard_cycle": 0.5,
        # A backstop for tasks that set no timeout of their own; executors enforce each
        # activity's own timeout (workers/activity_runner.py).
        "timeout": 3000,
        "retry": 3600,
        "catch_up": False,
        "poll": 0.2,
        "label": "Worker cluster",
    }
    cluster.update(overrides)
    return cluster


# The cache django-q2 keeps cluster statistics in: a database cache, so that every process
# and the admin see every cluster (``workers``' migration creates its table). Use it as
# ``CACHES = {"default": conf.CACHE}``, or under another alias with
# ``Q_CLUSTER = q_cluster(cache="<alias>")``.
CACHE = {
    "BACKEND": "workers.cache.ResilientDatabaseCache",
    "LOCATION": "obelisk_cache",
}


# The OPTIONS of a SQLite ``default`` database. Every transaction is ``BEGIN IMMEDIATE``,
# so a read-then-write store operation holds the single write lock from its first read
# (the single-writer guarantee), in WAL mode with ``synchronous=FULL`` because the engine
# advertises durability. PostgreSQL needs no options of its own.
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
    "init_command": "PRAGMA journal_mode=WAL;PRAGMA synchronous=FULL;PRAGMA foreign_keys=ON;PRAGMA busy_timeout=30000",
}
