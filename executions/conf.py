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
    # Where no LISTEN/NOTIFY exists (SQLite), waiters poll this often.
    "POLL_INTERVAL": timedelta(milliseconds=50),
}


def get(name: str):
    return getattr(settings, "OBELISK", {}).get(name, DEFAULTS[name])
