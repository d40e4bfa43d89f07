"""The engine as a reusable app, and the site's safe defaults.

- README.md's "Add to an existing project", followed literally: its blocks and the
  activity and workflow examples are read from README.md and applied to a fresh
  ``django-admin startproject mysite`` in a fresh virtualenv (``pip install`` of the source
  tree); its commands run a worker cluster and the example workflow to its end. All of it
  runs in subprocesses with their own SQLite file, never in the test database (D108).
- ``check --deploy`` is clean under the production environment README.md documents, and
  the site refuses to start with DEBUG off and no secret key.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from tests.support.processes import REPO, clean_env

pytestmark = pytest.mark.slow


# README.md, "Running in production": the documented production environment.
PRODUCTION_ENV = {
    "DJANGO_DEBUG": "0",
    "DJANGO_SECRET_KEY": "t3st-only-Xq9vLr2mZ8kWc4NpB7yHd1sFg6jTe0aUo5iRl3xCvKn-b_2QwE",
    "DJANGO_ALLOWED_HOSTS": "obelisk.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://obelisk.example.com",
    "DJANGO_SECURE_SSL_REDIRECT": "1",
    "DJANGO_SECURE_HSTS_PRELOAD": "1",
}


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

README = REPO / "README.md"
PLACEHOLDER = "/path/to/this/checkout"  # the README's pip line; the test's copy of the tree instead


def readme_section(title: str) -> str:
    """The text of README.md's ``## <title>`` section."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of ``text``: (language, body)."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


def readme_files() -> list[str]:
    """README's Python blocks that name their file on the first line (``# myapp/activities.py``,
    ``# mysite/settings.py, at the end``): the two examples, then the section's settings and
    URLs, in the order a reader applies them."""
    examples = [code_blocks(readme_section(title))[0] for title in ("Writing activities", "Writing workflows")]
    section = code_blocks(readme_section("Add to an existing project"))
    blocks = [body for language, body in examples + section if language == "python"]
    assert all(body.startswith("# ") for body in blocks), blocks
    return blocks


def readme_commands() -> list[list[str]]:
    """The shell lines of the section's ``sh`` blocks: installation, then running."""
    section = code_blocks(readme_section("Add to an existing project"))
    return [[line for line in body.splitlines() if line.strip()] for language, body in section if language == "sh"]


def write_file(block: str, project: Path) -> Path:
    """Apply one README block as it says: ``# <path>, at the end`` appends to that file,
    ``# <path>`` makes it."""
    first = block.splitlines()[0][2:]
    path, append = (first.removesuffix(", at the end"), True) if first.endswith(", at the end") else (first, False)
    target = project / path
    assert append == target.exists(), f"{path}: the README says {'append to' if append else 'make'} it"
    with open(target, "a" if append else "w") as out:
        out.write(("\n" if append else "") + block)
    return target


def registry_reachable(scratch: Path) -> bool:
    """The build needs setuptools and the dependencies from the package registry."""
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(scratch), "setuptools>=69"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return probe.returncode == 0


def installed_files_are_the_four_apps(python: Path) -> None:
    """Only the four apps are installed, with their migrations and commands."""
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


def test_readme_add_to_an_existing_project_works_as_written(tmp_path):
    """README.md, "Add to an existing project", followed literally: its blocks are taken from
    the file (not copied into this test), in a fresh ``django-admin startproject mysite``
    outside the repository: the pip line (with this tree for its placeholder), the settings
    and URLs appended, the activity and workflow examples written, then its commands — a
    worker cluster, and the example workflow submitted and run to its end. (The URLs line
    used ``include``, which startproject's urls.py does not import; the workflow imported
    ``reserve``, which the activity example did not define.)"""
    if connection.vendor != "sqlite":
        pytest.skip("runs once per test suite, in the SQLite pass: it uses subprocesses with their own SQLite file")
    if not registry_reachable(tmp_path / "probe"):
        pytest.skip("the package registry is unreachable: pip cannot install the dependencies")
    install, commands = readme_commands()
    files = readme_files()

    # The working tree without caches, virtualenvs or databases: pip builds in the source
    # directory, and its build/ and *.egg-info must not land in the repository.
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=IGNORED)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = clean_env(PATH=f"{venv / 'bin'}:{os.environ['PATH']}")  # as in a shell with the virtualenv activated
    subprocess.run(["django-admin", "startproject", "mysite"], cwd=tmp_path, env=env, check=True, timeout=60)
    project = tmp_path / "mysite"

    def shell(line: str, timeout: float = 600) -> subprocess.CompletedProcess:
        result = subprocess.run(
            ["bash", "-c", line], cwd=project, env=env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
        return result

    started = time.monotonic()
    for line in install:
        shell(line.replace(PLACEHOLDER, str(source)))
    print(f"venv + the README's installation: {time.monotonic() - started:.1f} s")
    installed_files_are_the_four_apps(venv / "bin" / "python")
    for block in files:
        write_file(block, project)
    shell("python manage.py check")
    # The console's templates ship with the package (executions/templates); the API is routed.
    checks = ("from django.template.loader import get_template as t; from django.urls import resolve; "
              "[t(n) for n in ('obelisk/confirm_action.html', 'obelisk/dashboard.html', "
              "'admin/obelisk_executions/executionstate/change_form.html')]; "
              "resolve('/api/v1/health'); resolve('/api/docs'); print('templates and urls ok')")  # fmt: skip

    *before, worker_line, submit_line = commands
    assert "obelisk_worker" in worker_line and "obelisk_submit" in submit_line, commands
    for line in before:
        shell(line)
    assert "templates and urls ok" in shell(f'python manage.py shell -c "{checks}"').stdout
    log_path = tmp_path / "worker.log"
    with open(log_path, "w") as log:
        worker = subprocess.Popen(
            ["bash", "-c", f"exec {worker_line}"],
            cwd=project,
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
        for ffqn in ("py:myapp/activities.charge", "py:myapp/activities.reserve", "py:myapp/workflows.order"):
            assert ffqn in log_path.read_text(), log_path.read_text()
        submitted = shell(submit_line, timeout=180)
        execution_id, result = submitted.stdout.splitlines()[:2]
        assert result.startswith('ok {"reserved": ['), result  # in the order the reservations finished
        assert '"book reserved for ada"' in result and '"pen reserved for ada"' in result, result
        status = shell(f"python manage.py obelisk_status {execution_id} --tree").stdout
        assert status.count("py:myapp/activities.reserve  ok") == 2, status
        assert "py:myapp/activities.charge  ok" in status, status
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    assert worker.returncode == 0, log_path.read_text()
    assert "worker cluster stopped" in log_path.read_text()
