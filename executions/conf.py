"""Engine settings with their defaults: ``settings.OBELISK`` overrides any key."""

from datetime import timedelta

from django.conf import settings

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
    # A stopping worker lets a running execution finish this long, then hands it back.
    "SHUTDOWN_GRACE": timedelta(seconds=20),
    # After a database outage the sweep leaves expired locks alone this long, so live
    # workers renew their locks and write their results first.
    "OUTAGE_LOCK_GRACE": timedelta(seconds=5),
    # Where no LISTEN/NOTIFY exists (SQLite), waiters poll this often.
    "POLL_INTERVAL": timedelta(milliseconds=50),
    # Retention: finished top-level executions (with their whole trees and everything that
    # belongs to them) are deleted this long after they finished, by `obelisk_retention`
    # or its hourly schedule (a timedelta). None keeps them forever.
    "RETENTION": None,
    # Top-level executions deleted per retention transaction.
    "RETENTION_BATCH_SIZE": 1000,
}


def get(name: str):
    return getattr(settings, "OBELISK", {}).get(name, DEFAULTS[name])
