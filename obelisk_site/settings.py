"""Django settings for Obelisk for Django.

One environment variable picks the database: ``DATABASE_URL``. Unset, the embedded
SQLite file under ``var/`` is used, so the demo runs with nothing installed; set it to a
``postgres://`` URL for the real target.
"""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("OBELISK_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "obelisk-dev-only-insecure-key")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_extensions",
    "django_q",
    "executions",
    "deployments",
    "workers",
    "obelisk_api",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "obelisk_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "obelisk_site.wsgi.application"


def database_from_env(url: str | None) -> dict:
    """Build the ``default`` database from ``DATABASE_URL`` (SQLite when unset).

    SQLite: every transaction is ``BEGIN IMMEDIATE`` so a read-then-write store operation
    holds the single write lock from its first read (the seed's single-writer guarantee),
    in WAL mode with ``synchronous=FULL`` because the engine advertises durability.
    PostgreSQL: persistent connections, because worker processes fork and a connection pool
    must never be inherited across ``fork()``.
    """
    if not url:
        url = f"sqlite:///{VAR_DIR / 'obelisk.sqlite3'}"
    config = dj_database_url.parse(url)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": (
                "PRAGMA journal_mode=WAL;PRAGMA synchronous=FULL;PRAGMA foreign_keys=ON;PRAGMA busy_timeout=30000"
            ),
        }
    else:
        config["CONN_MAX_AGE"] = 600
        config["CONN_HEALTH_CHECKS"] = True
        config.setdefault("OPTIONS", {})["application_name"] = "obelisk"
    return config


DATABASES = {"default": database_from_env(os.environ.get("DATABASE_URL"))}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# Cluster statistics (django-q2's admin page, ``qinfo``) must be visible across processes,
# so the cache lives in the database. ``workers``' migration creates its table.
CACHES = {
    "default": {
        "BACKEND": "workers.cache.ResilientDatabaseCache",
        "LOCATION": "obelisk_cache",
    }
}

# ---------------------------------------------------------------------------------------
# Obelisk engine settings. Every key has a default in ``executions.conf``.
# ---------------------------------------------------------------------------------------
OBELISK = {
    # Modules that register activities (imported by workers, the CLI and the API).
    "COMPONENT_MODULES": os.environ.get("OBELISK_COMPONENT_MODULES", "demo.activities,demo.workflows").split(","),
    # How long a stopping worker lets running executions finish before handing them back.
    "SHUTDOWN_GRACE": timedelta(seconds=float(os.environ.get("OBELISK_SHUTDOWN_GRACE_SECONDS", "20"))),
}

# django-q2 runs the executors: see docs/architecture.md, "Workers".
OBELISK_WORKERS = int(os.environ.get("OBELISK_WORKERS", "2"))
Q_CLUSTER = {
    "name": "obelisk",
    "workers": OBELISK_WORKERS,
    "broker_class": "workers.broker.ExecutionBroker",
    "orm": "default",
    # The execution tables are the source of truth; only failed batches are kept.
    "save_limit": -1,
    # Claim tasks are cheap; a short queue keeps claims close to a free worker.
    "queue_limit": OBELISK_WORKERS * 2,
    "recycle": 100_000,
    "guard_cycle": 0.5,
    # A backstop for tasks that set no timeout of their own; executors enforce each
    # activity's own timeout (workers/runner.py).
    "timeout": 3000,
    "retry": 3600,
    "catch_up": False,
    "poll": 0.2,
    "label": "Worker cluster",
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.environ.get("OBELISK_LOG_LEVEL", "WARNING")},
    "loggers": {
        "obelisk": {"level": os.environ.get("OBELISK_LOG_LEVEL", "INFO"), "propagate": True},
        "django-q": {"level": os.environ.get("Q_LOG_LEVEL", "WARNING")},
    },
}
