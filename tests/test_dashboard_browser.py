"""The dashboard in a real browser: a worker cluster shows up alive, and gone once stopped.

Chromium (Debian's, through Playwright) logs in to the admin of a live server as a
superuser; a real ``manage.py obelisk_worker`` cluster (``tests/workers_support.py``) runs
against the same test database. Screenshots go to ``var/screenshots/dashboard-*.png``.
The browser is the session's (``tests/conftest.py``).
"""

from __future__ import annotations

import signal
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.db import connections
from django.utils import timezone

from executions import store
from tests import components
from tests.workers_support import started_clusters, wait_until
from workers.submission import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCREENSHOTS = Path(__file__).resolve().parent.parent / "var" / "screenshots"
SIZES = [(1366, 768), (1920, 1080)]
PASSWORD = "dashboard-pw"


@pytest.fixture
def page(browser, live_server):
    get_user_model().objects.create_superuser("admin", "admin@example.com", PASSWORD)
    context = browser.new_context(viewport={"width": SIZES[0][0], "height": SIZES[0][1]})
    page = context.new_page()
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    try:
        yield page
    finally:
        context.close()
        # The test's database work ran while Playwright's loop was up, on a connection of
        # its own: close it, or the test database cannot be dropped at the end.
        connections.close_all()


def screenshot(page, name: str, size: tuple[int, int]) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.set_viewport_size({"width": size[0], "height": size[1]})
    path = SCREENSHOTS / f"dashboard-{name}-{size[0]}x{size[1]}.png"
    page.screenshot(path=str(path), full_page=False)
    return path


def _reported(pid: int):
    return next((c for c in store.list_clusters() if c.pid == pid and c.alive), None)


def test_the_dashboard_shows_a_cluster_alive_then_gone_once_stopped(page, live_server, request, tmp_path):
    with started_clusters(request, tmp_path) as start:
        cluster = start(1)
        info = wait_until(lambda: _reported(cluster.pid), timeout=30, what="the cluster's first heartbeat")
        row = page.locator(f'#obelisk-clusters tr[data-cluster="{info.cluster_id}"]')
        done = [submit(components.add.ffqn, [i, 1])[0] for i in range(3)]
        done.append(submit(components.error_value.ffqn, ["E42"])[0])
        submit(components.noop.ffqn, [], scheduled_at=timezone.now() + timedelta(hours=1))
        store.wait_for_finished(done, timeout=30)

        page.goto(f"{live_server.url}/admin/")
        assert row.count() == 1
        assert "alive" in row.get_attribute("class")
        assert "alive" in row.locator("td").first.inner_text()
        assert row.locator("td").nth(2).inner_text() == str(cluster.pid)
        assert "test:acts/basic.add" in row.locator("td.fn").get_attribute("title")
        assert page.locator("#obelisk-live [data-count=scheduled] .n").inner_text() == "1"
        assert page.locator("#obelisk-live [data-count=finished-last-hour] .n").inner_text() == "4"
        assert page.locator("#obelisk-outcomes tr[data-outcome=error]").count() == 1
        for size in SIZES:
            screenshot(page, "alive", size)

        cluster.signal_main(signal.SIGTERM)
        cluster.wait_exit(30)
        page.set_viewport_size({"width": SIZES[0][0], "height": SIZES[0][1]})
        page.reload()
        assert "gone" in row.get_attribute("class")
        assert "gone" in row.locator("td").first.inner_text()
        for size in SIZES:
            screenshot(page, "gone", size)
