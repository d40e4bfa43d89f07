"""The engine as a reusable app, and the site's safe defaults.

- ``pip install`` of the source tree into a fresh virtualenv, wired into a project made by
  ``django-admin startproject`` as README.md's "Add to an existing project" says: migrate,
  a worker cluster, an activity of the host project submitted and waited for. All of it
  runs in subprocesses with their own SQLite file, never in the test database.
- ``check --deploy`` is clean under the production environment README.md documents, and
  the site refuses to start with DEBUG off and no secret key.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

# README.md, "Running in production": the documented production environment.
PRODUCTION_ENV = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": "t3st-only-Xq9vLr2mZ8kWc4NpB7yHd1sFg6jTe0aUo5iRl3xCvKn-b_2QwE",
    "DJANGO_ALLOWED_HOSTS": "obelisk.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://obelisk.example.com",
    "DJANGO_SECURE_SSL_REDIRECT": "1",
    "DJANGO_SECURE_HSTS_PRELOAD": "1",
}

# Everything the environment of this test run may hold that would leak into a subprocess:
# the site's and the test settings' variables, and paths that would make the repository
# importable in the host project.
LEAKING = ("DJANGO_", "OBELISK_", "DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV", "Q_")


def clean_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(LEAKING)}
    env.update(extra)
    return env


def run_site(args: list[str], tmp_path: Path, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """``manage.py`` of this repository's site (obelisk_site.settings), var/ in tmp_path."""
    env = {"DJANGO_SETTINGS_MODULE": "obelisk_site.settings", "OBELISK_VAR_DIR": str(tmp_path / "var"), **env}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=REPO,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# -- safe defaults -------------------------------------------------------------------------


def test_check_deploy_is_clean_with_the_documented_production_environment(tmp_path):
    result = run_site(["check", "--deploy", "--fail-level", "WARNING"], tmp_path, PRODUCTION_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_flags_the_development_defaults(tmp_path):
    """DJANGO_DEBUG=1 alone starts, with the development key, and --deploy says what is wrong."""
    result = run_site(["check", "--deploy", "--fail-level", "WARNING"], tmp_path, {"DJANGO_DEBUG": "1"})
    assert result.returncode != 0
    for warning in ("security.W009", "security.W018", "security.W008"):  # key, DEBUG, SSL redirect
        assert warning in result.stderr, result.stderr


@pytest.mark.parametrize("debug", [None, "0"], ids=["DJANGO_DEBUG unset", "DJANGO_DEBUG=0"])
def test_the_server_refuses_to_start_without_a_secret_key_when_debug_is_off(tmp_path, debug):
    env = {} if debug is None else {"DJANGO_DEBUG": debug}
    # runserver would block if it started; it must fail at once, before binding a port.
    result = run_site(["runserver", "--noreload", "127.0.0.1:0"], tmp_path, env, timeout=60)
    assert result.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in result.stderr, result.stderr
    # The WSGI entry point (gunicorn, uwsgi) refuses too.
    wsgi = subprocess.run(
        [sys.executable, "-c", "import obelisk_site.wsgi"],
        cwd=REPO,
        env=clean_env(OBELISK_VAR_DIR=str(tmp_path / "var"), **env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wsgi.returncode != 0
    assert "ImproperlyConfigured: DJANGO_SECRET_KEY is not set" in wsgi.stderr, wsgi.stderr


def test_no_component_modules_by_default(tmp_path):
    code = "from django.conf import settings; print(settings.OBELISK['COMPONENT_MODULES'])"
    result = run_site(["shell", "-c", code], tmp_path, {"DJANGO_DEBUG": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


# -- the installable package ---------------------------------------------------------------

IGNORED = shutil.ignore_patterns(
    ".git",
    ".venv",
    "var",
    "build",
    "*.egg-info",
    "__pycache__",
    "*.pyc",
    "*.sqlite3*",
    ".pytest_cache",
    ".hypothesis",
    ".ruff_cache",
    "node_modules",
)

HOST_SETTINGS = """

# --- Obelisk (README.md, "Add to an existing project") ---
from executions import conf as obelisk_conf

INSTALLED_APPS += ["django_q", "executions", "deployments", "workers", "obelisk_api"]
DATABASES["default"]["OPTIONS"] = obelisk_conf.SQLITE_OPTIONS
CACHES = {"default": obelisk_conf.CACHE}
Q_CLUSTER = obelisk_conf.q_cluster(workers=1)
OBELISK = {"COMPONENT_MODULES": ["hostproj.jobs"]}
"""

HOST_URLS = """

# --- Obelisk ---
from django.urls import include

urlpatterns += [path("api/", include("obelisk_api.urls"))]
"""

HOST_JOBS = """
from workers import activity


@activity
def double(x: int) -> int:
    return 2 * x
"""


def registry_reachable(scratch: Path) -> bool:
    """The build needs setuptools and the dependencies from the package registry."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(scratch), "setuptools>=69"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return probe.returncode == 0


def test_pip_install_into_a_new_project_runs_an_activity(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("runs once per test suite, in the SQLite pass: it uses subprocesses with their own SQLite file")
    if not registry_reachable(tmp_path / "probe"):
        pytest.skip("the package registry is unreachable: pip cannot install the dependencies")

    # The working tree without caches, virtualenvs or databases: pip builds in the source
    # directory, and its build/ and *.egg-info must not land in the repository.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=IGNORED)
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(source)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    install_seconds = time.monotonic() - started
    assert install.returncode == 0, install.stdout + install.stderr
    print(f"venv + pip install: {install_seconds:.1f} s")

    # Only the four apps are installed, with their migrations and commands.
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for expected in (
        "executions/migrations/0001_initial.py",
        "executions/management/commands/obelisk_submit.py",
        "executions/store/__init__.py",
        "deployments/migrations/0001_initial.py",
        "workers/migrations/0001_cache_table.py",
        "workers/management/commands/obelisk_worker.py",
        "obelisk_api/urls.py",
    ):
        assert (site_packages / expected).is_file(), expected
    for absent in ("obelisk_site", "demo", "tests", "bench"):
        assert not (site_packages / absent).exists(), f"{absent} must not be installed"

    # A new project, wired as the README says, outside the repository.
    host = tmp_path / "host"
    host.mkdir()
    subprocess.run(
        [str(venv / "bin" / "django-admin"), "startproject", "hostproj", str(host)],
        env=clean_env(),
        check=True,
        timeout=60,
    )
    with open(host / "hostproj" / "settings.py", "a") as settings:
        settings.write(HOST_SETTINGS)
    with open(host / "hostproj" / "urls.py", "a") as urls:
        urls.write(HOST_URLS)
    (host / "hostproj" / "jobs.py").write_text(HOST_JOBS.lstrip())

    env = clean_env(DJANGO_SETTINGS_MODULE="hostproj.settings")

    def manage(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(python), "manage.py", *args], cwd=host, env=env, capture_output=True, text=True, timeout=timeout
        )

    migrate = manage("migrate", "-v0")
    assert migrate.returncode == 0, migrate.stdout + migrate.stderr
    check = manage("check")
    assert check.returncode == 0, check.stdout + check.stderr
    # The console's templates ship with the package (executions/templates).
    templates = manage("shell", "-c", "from django.template.loader import get_template as t; "
                       "[t(n) for n in ('obelisk/confirm_action.html', 'obelisk/dashboard.html', "
                       "'admin/obelisk_executions/executionstate/change_form.html')]; print('templates ok')")  # fmt: skip
    assert "templates ok" in templates.stdout, templates.stdout + templates.stderr

    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            [str(python), "manage.py", "obelisk_worker", "--workers", "1"],
            cwd=host,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        # Submission is checked against the functions the worker registered at start.
        deadline = time.monotonic() + 60
        while "worker cluster:" not in log_path.read_text():
            assert worker.poll() is None, f"the worker exited: {log_path.read_text()}"
            assert time.monotonic() < deadline, f"the worker did not start: {log_path.read_text()}"
            time.sleep(0.2)
        assert "py:hostproj/jobs.double" in log_path.read_text()

        submit = manage("obelisk_submit", "py:hostproj/jobs.double", "[21]", "--wait", "--timeout", "60")
        assert submit.returncode == 0, submit.stdout + submit.stderr + log_path.read_text()
        assert "42" in submit.stdout, submit.stdout
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert worker.returncode == 0, log_path.read_text()
    assert "worker cluster stopped" in log_path.read_text()
