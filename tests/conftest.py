import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
    # Browser tests last: the session's Playwright keeps an event loop in the main thread
    # from its first use on, which the other tests must not run under.
    items.sort(key=lambda item: "browser" in getattr(item, "fixturenames", ()))
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL")
    for item in items:
        if "postgres_only" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def on_postgres():
    return connection.vendor == "postgresql"


@pytest.fixture(scope="session", autouse=True)
def _close_listen_connection(django_db_setup, django_db_blocker):
    """The LISTEN connection, and the connections idle workflow threads keep (D73), must be
    gone before pytest-django drops the test database; so must those of the watchdog threads
    of executors the tests made (a watchdog that renewed a lock keeps its thread's
    connection, and lives as long as the process): their sessions are ended."""
    yield
    from executions import notify
    from workers.workflow_pool import retire_idle_threads

    notify.stop_listening()
    retire_idle_threads()
    if connection.vendor == "postgresql":
        with django_db_blocker.unblock(), connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium through Playwright, one per test session: a second sync
    Playwright cannot start in the same thread, so every browser test shares this one."""
    import os

    from tests.support.browser import CHROMIUM

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: apt-get install -y chromium")
    # Playwright's sync API runs an event loop in this thread; the tests' ORM calls stay
    # synchronous.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def operator():
    """A user who may read and act (the API tests' caller)."""
    from tests.support.api import ACT, VIEW, make_user

    return make_user("ada", VIEW, ACT)


@pytest.fixture
def api(operator):
    """The REST API as ``operator``, by bearer token (``tests.support.api.Api``)."""
    from tests.support.api import api_for

    return api_for(operator)


@pytest.fixture(autouse=True)
def _forget_deployments():
    """Processes keep what they learned about deployments (immutable, so never stale in
    production); a test's database is emptied after it, so each test starts without."""
    from executions import catalog
    from workers import testing

    catalog.forget()
    testing._deployment_for.cache_clear()
    yield
