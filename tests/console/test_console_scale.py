"""The executions list stays cheap on a big table (issue 36, items 3, 4 and 6).

Through Django's test client as a logged-in superuser, on PostgreSQL and SQLite:

- the list shows top-level executions unless asked for children (as Temporal does);
- relative time filters select by creation and by finish: last 15 minutes, hour, day, week;
- "Show counts" (the admin's facets) asks nothing: facets are off (D94);
- the paginator's count stops at ``MAX_COUNT`` (D94);
- on PostgreSQL, every query of every console page is EXPLAINed with sequential scans
  priced out (``enable_seqscan = off``, as on a big table): none may read ``t_state`` or
  ``t_execution_log`` whole; each scan of them has an index range, a partial index, or a
  ``LIMIT`` above it. (A walk under a ``LIMIT`` reads until the page is full: fast when the
  filter matches often, and the filters that match rarely have indexes of their own.)
  How long the pages take on a million rows is ``bench/console.py``'s to show; a timing
  here could not fail honestly.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from executions import store
from executions.console.limits import MAX_COUNT
from executions.events import Err, ExecutionFailure, Finished, Ok
from tests.support import browser as support
from tests.support.helpers import block_on_child, create, create_workflow, deploy_components, lock
from tests.support.schedules_console import make_schedules

LIST = "admin:obelisk_executions_executionstate_changelist"
BIG_TABLES = ("t_state", "t_execution_log")

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client):
    support.make_admin()
    client.login(username="admin", password=support.ADMIN_PASSWORD)
    return client


def listed(client, **query) -> set[str]:
    response = client.get(reverse(LIST), query)
    assert response.status_code == 200, response.content[:500]
    return set(re.findall(r'<span title="([^"]+)" class="obelisk-id">', response.content.decode()))


def finish(execution_id: str, retval, at) -> None:
    locked = lock(execution_id, now=at - timedelta(seconds=1))
    store.append(execution_id, None, Finished(retval=retval), fence=locked.fence, now=at)


@pytest.fixture
def ages():
    """Executions created (and finished) at known distances before now."""
    now = timezone.now()
    rows = {}
    for name, age in (("10m", 10), ("50m", 50), ("5h", 300), ("3d", 3 * 1440), ("10d", 10 * 1440)):
        rows[name] = create(now=now - timedelta(minutes=age))
    # Created three days ago, finished ten minutes ago; created ten minutes ago, still pending.
    finish(rows["3d"], Ok(1), now - timedelta(minutes=10))
    finish(rows["10d"], ExecutionFailure("timed_out", "slow"), now - timedelta(days=9))
    workflow = create_workflow(now=now - timedelta(minutes=5))
    locked = lock(workflow, now=now - timedelta(minutes=5))
    _, rows["child"], _ = block_on_child(workflow, locked, now=now - timedelta(minutes=5))
    rows["workflow"] = workflow
    return rows


def test_the_list_shows_top_level_executions_unless_asked_for_children(admin_client, ages):
    top_level = {ages[name] for name in ("10m", "50m", "5h", "3d", "10d", "workflow")}
    assert listed(admin_client) == top_level
    assert listed(admin_client, top_level="all") == top_level | {ages["child"]}
    assert listed(admin_client, top_level="children") == {ages["child"]}
    page = admin_client.get(reverse(LIST)).content.decode()
    assert "with children" in page  # the filter that shows them


def test_relative_time_filters_select_by_creation_and_by_finish(admin_client, ages):
    every = {"top_level": "all"}
    assert listed(admin_client, created="15m", **every) == {ages["10m"], ages["workflow"], ages["child"]}
    assert listed(admin_client, created="1h", **every) == {ages["10m"], ages["50m"], ages["workflow"], ages["child"]}
    assert listed(admin_client, created="1d") == {ages["10m"], ages["50m"], ages["5h"], ages["workflow"]}
    assert listed(admin_client, created="7d") == {ages["10m"], ages["50m"], ages["5h"], ages["3d"], ages["workflow"]}
    assert listed(admin_client, finished="15m") == {ages["3d"]}  # finished lately, created long ago
    assert listed(admin_client, finished="7d") == {ages["3d"]}
    assert listed(admin_client, finished="15m", outcome="ok") == {ages["3d"]}
    assert listed(admin_client, finished="15m", outcome="failed") == set()
    # An unknown window is ignored, as Django ignores an unknown choice of a filter.
    assert admin_client.get(reverse(LIST), {"created": "1y"}).status_code == 200


def test_show_counts_asks_the_database_no_facet_counts(admin_client, ages):
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(reverse(LIST), {"_facets": "1"})
    assert response.status_code == 200
    sql = [q["sql"] for q in queries.captured_queries]
    assert not [s for s in sql if "FILTER (WHERE" in s.upper()]
    assert "Show counts" not in response.content.decode()


def test_the_count_of_a_long_list_stops_at_its_cap(admin_client, monkeypatch):
    from executions.console import limits

    monkeypatch.setattr(limits, "MAX_COUNT", 3)
    for _ in range(5):
        create()
    page = admin_client.get(reverse(LIST)).content.decode()
    assert "more than 3 executions" in page
    assert MAX_COUNT >= 10_000


def test_the_function_filter_offers_the_deployed_functions(admin_client):
    deploy_components()
    page = admin_client.get(reverse(LIST)).content.decode()
    assert "?ffqn=test%3Aacts%2Fbasic.add" in page or "?ffqn=test:acts/basic.add" in page
    add = create("test:acts/basic.add", [1, 2])
    other = create()
    assert listed(admin_client, ffqn="test:acts/basic.add") == {add}
    assert other in listed(admin_client)


def test_search_finds_by_id_function_and_result_text(admin_client, ages):
    now = timezone.now()
    failed = create(now=now - timedelta(minutes=2))
    finish(failed, ExecutionFailure("uncategorized", "KeyError: 'needle'"), now)
    errored = create(now=now - timedelta(minutes=2))
    finish(errored, Err({"code": "E_NEEDLE_2"}), now)
    retrying = create(now=now - timedelta(minutes=2))
    locked = lock(retrying, now=now - timedelta(minutes=1))
    final = Finished(retval=ExecutionFailure("uncategorized", "gave up"))
    store.append(retrying, None, store.AttemptFailed("OSError: needle", final, detail="..."), fence=locked.fence)
    assert store.get_state(retrying).state == "pending_at"  # a failed attempt, retried later
    assert listed(admin_client, q="needle") == {failed, errored, retrying}
    assert listed(admin_client, q="needle", outcome="failed") == {failed}
    assert listed(admin_client, q=ages["5h"]) == {ages["5h"]}  # a whole id
    assert listed(admin_client, q=ages["5h"][-6:]) == {ages["5h"]}  # part of one
    assert ages["child"] in listed(admin_client, q=ages["child"])  # a child's whole id finds it
    assert len(listed(admin_client, q="pkg/ifc")) == 8  # the function, top-level executions


# -- no sequential scan of the big tables -----------------------------------------------------


def _console_urls(ages) -> list[str]:
    base = reverse(LIST)
    filters = [
        "",
        "?p=2",
        "?outcome=ok",
        "?outcome=failed",
        "?outcome=error",
        "?outcome=pending",
        "?outcome=scheduled",
        "?outcome=running",
        "?outcome=blocked",
        "?outcome=paused",
        "?outcome=cancelling",
        "?outcome=timed_out",
        "?state__exact=finished",
        "?state__exact=blocked_by_join_set",
        "?lifecycle__exact=paused",
        "?top_level=all",
        "?top_level=children",
        "?created=15m",
        "?created=7d",
        "?finished=1h",
        "?finished=1h&outcome=failed&top_level=all",
        "?ffqn=test:pkg/ifc.fn",
        "?deployment=Dep_x",
        "?q=needle",
        f"?q={ages['5h']}",
        "?q=needle&outcome=failed",
    ]
    page = reverse("admin:obelisk_executions_executionstate_change", args=[ages["workflow"]])
    deployment, component = _deployed()
    filters += [f"?component={component}"]
    schedules = make_schedules()  # ticks started, finished, skipped, missed, failed
    pages = [
        page,
        reverse("admin:obelisk_deployments_deployment_change", args=[deployment]),
        reverse("admin:obelisk_deployments_componentmetadata_change", args=[component]),
        reverse("admin:obelisk_executions_schedule_changelist"),
        reverse("admin:obelisk_executions_schedule_change", args=[schedules.sync]),
        reverse("admin:obelisk_executions_webhookcall_changelist"),
    ]
    return ["/admin/"] + pages + [base + f for f in filters]


def _deployed() -> tuple[str, str]:
    """A deployment of the tests' components and one of its component digests: their pages
    count the executions pinned to them."""
    from executions.models import DeploymentComponent

    deploy_components()
    link = DeploymentComponent.objects.order_by("deployment_id").first()
    return link.deployment_id, link.component_id


def _plan(sql: str) -> dict:
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        (plan,) = cursor.fetchone()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


def _indexes() -> dict[str, bool]:
    """Index name → partial? for the indexes of the big tables."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = ANY(%s)", [list(BIG_TABLES)])
        return {name: " WHERE " in definition for name, definition in cursor.fetchall()}


def unbounded_scans(node: dict, indexes: dict[str, bool], limited: bool = False) -> list[str]:
    """The scans of the big tables in a plan that may read them whole: a sequential scan, or
    an index scan with no range (``Index Cond``), not of a partial index, and not under a
    ``Limit`` (an index walked in order that stops when the page is full)."""
    found = []
    limited = limited or node["Node Type"] == "Limit"
    if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in BIG_TABLES:
        found.append(f"Seq Scan on {node['Relation Name']}")
    index = node.get("Index Name")
    if index in indexes and "Index Cond" not in node and not indexes[index] and not limited:
        found.append(f"{node['Node Type']} of all of {index}")
    for child in node.get("Plans", []):
        found += unbounded_scans(child, indexes, limited)
    return found


@pytest.mark.postgres_only
def test_no_console_page_reads_the_execution_tables_whole(admin_client, ages):
    indexes = _indexes()
    scanned = []
    for url in _console_urls(ages):
        with CaptureQueriesContext(connection) as queries:
            response = admin_client.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        for query in queries.captured_queries:
            sql = query["sql"]
            if not sql.lstrip().upper().startswith("SELECT") or not any(t in sql for t in BIG_TABLES):
                continue
            found = unbounded_scans(_plan(sql), indexes)
            if found:
                scanned.append(f"{url}: {found}\n  {sql[:300]}")
    assert not scanned, "\n".join(scanned)


@pytest.mark.postgres_only
def test_the_scan_check_sees_a_whole_table_read():
    """The check above can fail: the queries the list used to make are caught."""
    indexes = _indexes()
    assert unbounded_scans(_plan("SELECT COUNT(*) FROM t_state WHERE is_top_level"), indexes)
    assert unbounded_scans(_plan("SELECT DISTINCT ffqn FROM t_state ORDER BY ffqn"), indexes)
    assert not unbounded_scans(_plan("SELECT * FROM t_state ORDER BY created_at DESC LIMIT 51"), indexes)


@pytest.mark.postgres_only
def test_the_list_and_the_dashboard_read_without_jit_and_leave_the_session_as_it_was(admin_client):
    def jit() -> str:
        with connection.cursor() as cursor:
            cursor.execute("SHOW jit")
            return cursor.fetchone()[0]

    before = jit()
    for url in (reverse(LIST), "/admin/"):
        with CaptureQueriesContext(connection) as queries:
            assert admin_client.get(url).status_code == 200
        sql = [q["sql"] for q in queries.captured_queries]
        reads = [i for i, s in enumerate(sql) if "t_state" in s]
        assert reads and sql.index("SET jit = off") < reads[0] and sql.index("RESET jit") > reads[-1]
        assert jit() == before
