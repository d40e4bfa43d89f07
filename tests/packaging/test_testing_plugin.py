"""The testing toolkit's pytest plugin ships with the package (issue 41): ``pip install`` of
the source tree into a fresh project exposes the fixtures through the ``pytest11`` entry
point, and a user's test that uses ``obelisk_env`` runs there, with no conftest and no
import of the plugin: a workflow with a day-long sleep and a stubbed activity, a real
activity with ``current_activity()``, and an unused stub failing its test at teardown.

The package is installed with ``--no-deps`` into a directory of its own (the dependencies
are this checkout's virtualenv's; the README's test installs them from the registry; the
build needs setuptools from it, or the test is skipped), and
pytest runs in a ``django-admin startproject`` project outside the repository, so the
``workers`` it imports is the installed one. why: D120
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest
from django.db import connection

from tests.packaging.test_packaging import IGNORED, registry_reachable
from tests.support.processes import REPO, clean_env

pytestmark = pytest.mark.slow

SETTINGS = """
from executions import conf as obelisk_conf

INSTALLED_APPS += ["django_q", "ninja", "executions", "deployments", "workers", "obelisk_api"]
OBELISK = {"COMPONENT_MODULES": ["myapp.activities", "myapp.workflows"]}
Q_CLUSTER = obelisk_conf.q_cluster(workers=1)
CACHES = {"default": obelisk_conf.CACHE}
DATABASES["default"]["OPTIONS"] = obelisk_conf.SQLITE_OPTIONS
"""

ACTIVITIES = """
from workers import activity, current_activity

@activity(max_retries=2)
def charge(customer: str, cents: int) -> dict:
    raise ConnectionError("no payment provider in tests")

@activity
def refund(customer: str) -> None:
    pass

@activity
def attempt_number(label: str) -> str:
    return f"{label} {current_activity().attempt}"
"""

WORKFLOWS = """
from datetime import timedelta

from myapp.activities import attempt_number, charge
from workers import workflow

@workflow
def bill(ctx, customer: str) -> dict:
    label = ctx.call(attempt_number, "attempt")
    ctx.sleep(timedelta(days=1))
    return {"label": label, "receipt": ctx.call(charge, customer, 500), "at": ctx.now().isoformat()}
"""

USER_TESTS = """
from datetime import UTC, datetime

import pytest

from myapp.activities import charge, refund
from myapp.workflows import bill
from workers.testing import StubError

def test_a_bill_a_day_later(obelisk_env):
    run = obelisk_env.run(bill, "ada", activities={charge: {"ok": True}}, now=datetime(2026, 1, 1, tzinfo=UTC))
    assert run.value == {"label": "attempt 1", "receipt": {"ok": True}, "at": "2026-01-02T00:00:00+00:00"}
    assert [c.args for c in run.calls_of(charge)] == [("ada", 500)]

def test_an_unknown_function_is_named(obelisk_env):
    with pytest.raises(StubError, match="py:myapp/nowhere.fn"):
        obelisk_env.run(bill, "ada", activities={"py:myapp/nowhere.fn": 1})

def test_an_unused_stub_fails_the_test(obelisk_env):
    obelisk_env.run(bill, "ada", activities={charge: {"ok": 1}, refund: None})
"""


def test_pip_install_exposes_obelisk_env_to_a_fresh_project(tmp_path):
    if connection.vendor != "sqlite":
        pytest.skip("runs once per test suite, in the SQLite pass: a project of its own in subprocesses")
    if not registry_reachable(tmp_path / "probe"):
        pytest.skip("the package registry is unreachable: pip cannot build the package")
    source, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(REPO, source, ignore=IGNORED)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    assert list(site.glob("obelisk_django-*.dist-info/entry_points.txt")), "no entry points installed"
    env = clean_env(PYTHONPATH=str(site))
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite"], cwd=tmp_path, env=env, check=True, timeout=60
    )
    project = tmp_path / "mysite"
    with open(project / "mysite" / "settings.py", "a") as settings:
        settings.write(SETTINGS)
    (project / "myapp").mkdir()
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "activities.py").write_text(textwrap.dedent(ACTIVITIES))
    (project / "myapp" / "workflows.py").write_text(textwrap.dedent(WORKFLOWS))
    (project / "tests").mkdir()
    (project / "tests" / "test_bill.py").write_text(textwrap.dedent(USER_TESTS))
    (project / "pytest.ini").write_text("[pytest]\nDJANGO_SETTINGS_MODULE = mysite.settings\n")

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests"],
        cwd=project, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert "3 passed, 1 error" in output, output
    assert "ERROR at teardown of test_an_unused_stub_fails_the_test" in output, output
    assert "stubbed but never called: py:myapp/activities.refund" in output, output
    imported = subprocess.run(
        [sys.executable, "-c", "import workers.testing.plugin as p; print(p.__file__)"],
        cwd=project, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert imported.stdout.startswith(str(site)), imported.stdout + imported.stderr
