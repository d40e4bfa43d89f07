"""Shared pieces of the console tests: executions in the states an operator looks at
(made through the client and the store, never by writing rows), users, and for the browser
tests a logged-in Playwright page on pytest-django's live server, with screenshots.

Playwright's sync API runs an event loop in the test's thread, so Django's guard against
ORM calls from async code must be relaxed for these tests (``DJANGO_ALLOW_ASYNC_UNSAFE``):
the ORM calls are the test's own, made between page interactions, never concurrently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from executions import client, store
from executions.events import Err, ExecutionFailure, Finished, Ok
from tests.support import helpers

BASE_DIR = Path(__file__).resolve().parents[2]
SCREENSHOTS = BASE_DIR / "var" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
ADMIN_PASSWORD = "admin"

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/tests/support/components.py", line 36, in always_fails\n'
    '    raise ValueError("this never works")\n'
    "ValueError: this never works\n"
)
FAILS = "test:acts/basic.always-fails"
ADD = "test:acts/basic.add"
NOOP = "test:acts/basic.noop"
ERROR_VALUE = "test:acts/basic.error-value"


@dataclass(frozen=True)
class Scenario:
    failed: str
    ok: str
    error_value: str
    running: str
    pending: str
    paused: str
    workflow: str
    child: str


def _lock(execution_id: str):
    """Lock it now, or when it is due if that is (a few milliseconds) later."""
    from django.utils import timezone

    from executions.ids import new_executor_id, new_run_id

    state = store.get_state(execution_id)
    return store.lock_one(
        execution_id,
        state.next_version,
        helpers.WORKFLOW_TERMS if state.component_type == "workflow" else helpers.TERMS,
        executor_id=new_executor_id(),
        run_id=new_run_id(),
        deployment_id=state.deployment_id,  # a lock records the locker's deployment: keep the row's
        now=max(timezone.now(), state.pending_expires_finished),
    )


def failed_execution() -> str:
    """An activity that failed once (a ``TemporarilyFailed`` with a traceback), then for good
    (``Finished`` with an ``uncategorized`` failure carrying the traceback)."""
    execution_id = client.submit(FAILS, []).execution_id
    locked = _lock(execution_id)
    final = Finished(retval=ExecutionFailure("uncategorized", "ValueError: this never works", TRACEBACK))
    store.append(
        execution_id,
        None,
        store.AttemptFailed("ValueError: this never works", final, detail=TRACEBACK),
        fence=locked.fence,
    )
    store.append(execution_id, store.get_state(execution_id).next_version, final)
    return execution_id


def finished(ffqn: str, arguments: list, retval) -> str:
    execution_id = client.submit(ffqn, arguments).execution_id
    locked = _lock(execution_id)
    store.append(execution_id, None, Finished(retval=retval), fence=locked.fence)
    return execution_id


def running() -> str:
    execution_id = client.submit(NOOP, []).execution_id
    _lock(execution_id)
    return execution_id


def workflow_with_child() -> tuple[str, str]:
    """A workflow that started a child, waited, got its result and finished ok."""
    workflow = helpers.create_workflow()
    locked = _lock(workflow)
    _, child, _ = helpers.block_on_child(workflow, locked)
    child_lock = _lock(child)
    store.append(child, None, Finished(retval=Ok(42)), fence=child_lock.fence)
    again = _lock(workflow)
    store.append(workflow, None, Finished(retval=Ok("done")), fence=again.fence)
    return workflow, child


def make_scenario() -> Scenario:
    helpers.deploy_components()
    workflow, child = workflow_with_child()
    paused = client.submit(NOOP, []).execution_id
    client.pause(paused)
    return Scenario(
        failed=failed_execution(),
        ok=finished(ADD, [1, 2], Ok(3)),
        error_value=finished(ERROR_VALUE, ["E42"], Err({"code": "E42"})),
        running=running(),
        pending=client.submit(NOOP, []).execution_id,
        paused=paused,
        workflow=workflow,
        child=child,
    )


def make_admin():
    from django.contrib.auth.models import User

    return User.objects.create_superuser("admin", "admin@example.com", ADMIN_PASSWORD)


def make_viewer(username: str = "viewer", password: str = "viewer"):
    """A staff user who may view executions but not act on them."""
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user(username, password=password, is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_executionstate", content_type__app_label="obelisk_executions")
    )
    return user


# ---------------------------------------------------------------------------------------
# Playwright
# ---------------------------------------------------------------------------------------


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport={"width": 1366, "height": 768})
    context.set_default_timeout(15_000)
    page = context.new_page()
    page.live_server_url = live_server.url
    yield page
    context.close()


def log_in(page, username: str = "admin", password: str = ADMIN_PASSWORD) -> None:
    page.goto(page.live_server_url + "/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    page.wait_for_selector("#user-tools")


def screenshot(page, name: str, sizes=((1366, 768), (1920, 1080)), full_page: bool = False) -> list[Path]:
    """Save the page at each viewport size as ``var/screenshots/<name>-<w>x<h>.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    original = page.viewport_size
    saved = []
    for width, height in sizes:
        page.set_viewport_size({"width": width, "height": height})
        target = SCREENSHOTS / f"{name}-{width}x{height}.png"
        page.screenshot(path=str(target), full_page=full_page)
        saved.append(target)
    if original:
        page.set_viewport_size(original)
    return saved
