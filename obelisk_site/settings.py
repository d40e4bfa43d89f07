"""Django settings for Obelisk for Django.

One environment variable picks the database: ``DATABASE_URL``. Unset, the embedded
SQLite file under ``var/`` is used, so the demo runs with nothing installed; set it to a
``postgres://`` URL for the real target.

Safe by default: ``DEBUG`` is off unless ``DJANGO_DEBUG=1``, and with ``DEBUG`` off
``DJANGO_SECRET_KEY`` is required. Everything a production deployment sets comes from
``DJANGO_*`` environment variables (README.md, "Running in production"), so that
``manage.py check --deploy`` is clean there.
"""

import os
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from executions import conf as obelisk_conf


def env_flag(name: str, default: bool = False) -> bool:
    """``1``/``true``/``yes``/``on`` (any case) is on, ``0``/``false``/``no``/``off``/empty is off."""
    value = os.environ.get(name)
    if value is None:
        return default
    value = value.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={os.environ[name]!r}: expected 1 or 0")


def env_list(name: str, default: str = "") -> list[str]:
    """A comma-separated environment variable as a list, blanks dropped."""
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("OBELISK_VAR_DIR", BASE_DIR / "var"))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_flag("DJANGO_DEBUG")
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. With DEBUG off (the default) a secret key is required: "
            "export DJANGO_SECRET_KEY=\"$(python3 -c 'import secrets; print(secrets.token_urlsafe(50))')\" "
            "(keep it secret and the same on every host), or export DJANGO_DEBUG=1 for local development only."
        )
    SECRET_KEY = "obelisk-dev-only-insecure-key"  # DEBUG only; `check --deploy` flags it
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")

# HTTPS. DJANGO_SECURE_SSL_REDIRECT=1 says the site is served over HTTPS only: HTTP is
# redirected, cookies are sent over HTTPS only, and HSTS is on (one year unless
# DJANGO_SECURE_HSTS_SECONDS says otherwise). Behind a proxy that terminates TLS, set
# DJANGO_SECURE_PROXY_SSL_HEADER=1 so that its X-Forwarded-Proto: https counts as HTTPS.
SECURE_SSL_REDIRECT = env_flag("DJANGO_SECURE_SSL_REDIRECT")
SESSION_COOKIE_SECURE = env_flag("DJANGO_SECURE_COOKIES", SECURE_SSL_REDIRECT)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS", "31536000" if SECURE_SSL_REDIRECT else "0"))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_flag("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_flag("DJANGO_SECURE_HSTS_PRELOAD")
if env_flag("DJANGO_SECURE_PROXY_SSL_HEADER"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_extensions",
    "django_q",
    "ninja",  # serves Swagger UI's assets itself: /api/docs works without Internet access (D92)
    "executions",
    "deployments",
    "workers",
    "obelisk_api",
]

MIDDLEWARE = [
    "obelisk_api.middleware.JsonErrorsMiddleware",  # JSON errors under /api/, first to see all (D103)
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "obelisk_site.urls"
CSRF_FAILURE_VIEW = "obelisk_api.middleware.csrf_failure"  # `csrf_failed` in JSON under /api/

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
        config["OPTIONS"] = dict(obelisk_conf.SQLITE_OPTIONS)
    else:
        config["CONN_MAX_AGE"] = 600
        config["CONN_HEALTH_CHECKS"] = True
        options = config.setdefault("OPTIONS", {})
        options["application_name"] = "obelisk"
        # Server-side binding, so psycopg prepares a statement the fifth time a connection
        # runs it: the server then skips parsing and planning it (D71).
        options.setdefault("server_side_binding", True)
        options.setdefault("prepare_threshold", 5)
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
CACHES = {"default": obelisk_conf.CACHE}

# ---------------------------------------------------------------------------------------
# Obelisk engine settings. Every key has a default in ``executions.conf``.
# ---------------------------------------------------------------------------------------
OBELISK = {
    # Modules that register activities (imported by workers, the CLI and the API).
    # Empty by default; scripts/demo.sh sets the demo's (demo.activities,demo.workflows).
    "COMPONENT_MODULES": env_list("OBELISK_COMPONENT_MODULES"),
    # How long a stopping worker lets running executions finish before handing them back.
    "SHUTDOWN_GRACE": timedelta(seconds=float(os.environ.get("OBELISK_SHUTDOWN_GRACE_SECONDS", "20"))),
    # API long polls (D101, D102): the longest wait, and how many one server process, and
    # one user in it, may have open at once (README.md, "Serving the API").
    "MAX_WAIT": timedelta(seconds=float(os.environ.get("OBELISK_MAX_WAIT_SECONDS", "25"))),
    "MAX_WAITS_PER_PROCESS": int(os.environ.get("OBELISK_MAX_WAITS_PER_PROCESS", "12")),
    "MAX_WAITS_PER_USER": int(os.environ.get("OBELISK_MAX_WAITS_PER_USER", "8")),
    # Webhook endpoints (D117-D119): where they are served, and their secrets by name (a
    # name not here is read from the environment; README.md, "Webhook endpoints").
    "WEBHOOK_PREFIX": os.environ.get("OBELISK_WEBHOOK_PREFIX", "hooks/"),
    "WEBHOOK_SECRETS": {},
}

# django-q2 runs the executors: see docs/architecture.md, "Workers".
OBELISK_WORKERS = int(os.environ.get("OBELISK_WORKERS", "2"))
Q_CLUSTER = obelisk_conf.q_cluster(workers=OBELISK_WORKERS)

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
