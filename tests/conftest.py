import pytest
from django.db import connection


def pytest_collection_modifyitems(config, items):
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
    """The LISTEN connection must be gone before pytest-django drops the test database."""
    yield
    from executions import notify

    notify.stop_listening()
