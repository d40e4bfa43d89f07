"""Issue 38 in the console, without a browser: an execution whose code no live cluster
serves says so on its page and on the dashboard; a blocked workflow's backtrace shows its
source lines from the deployment's stored files; a deployment's page offers the upgrade dry
run, whose report page is a table of what the replay found, for staff allowed to view
deployments. Executions are made through the store and run through the worker's path."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from executions.events import ComponentId
from tests.support import browser as support
from tests.support import deployments as scenarios
from workers.components import load_deployment

pytestmark = pytest.mark.django_db(transaction=True)  # workflows run in threads


@pytest.fixture
def sample(tmp_path, monkeypatch):
    code = scenarios.sample_code(tmp_path, monkeypatch)
    yield code
    scenarios.forget(code)


@pytest.fixture
def admin_client(client, transactional_db):
    support.make_admin()
    client.login(username="admin", password=support.ADMIN_PASSWORD)
    return client


def page_of(client, execution_id: str) -> str:
    response = client.get(reverse("admin:obelisk_executions_executionstate_change", args=[execution_id]))
    assert response.status_code == 200
    return response.content.decode()


def heartbeat(cluster_id: str, deployment_id: str) -> None:
    from executions import store

    store.record_heartbeat(
        cluster_id,
        hostname="host",
        pid=1,
        started_at=timezone.now(),
        processes=1,
        running=0,
        functions=[],
        deployment_id=deployment_id,
    )


@pytest.fixture
def unserved(sample):
    """A due activity pinned to a digest of deployment A while a live cluster serves B."""
    mine = scenarios.old_deployment(sample)
    digest = scenarios.old_digest(sample.package + "v0")
    component = ComponentId(component_type="activity", name=sample.package, component_digest=digest)
    execution_id = scenarios.pinned(sample.ffqn("add"), [1, 2], component, mine)
    heartbeat("host:1:B", scenarios.other_deployment("t5_served"))
    return execution_id, digest, mine


def test_the_execution_page_says_when_no_live_cluster_serves_its_code(admin_client, unserved):
    execution_id, digest, mine = unserved
    body = page_of(admin_client, execution_id)
    assert f"waiting for component {digest} (not served)" in body
    assert 'id="obelisk-waiting-for"' in body
    heartbeat("host:2:A", mine)
    assert 'id="obelisk-waiting-for"' not in page_of(admin_client, execution_id)


def test_the_dashboard_counts_the_executions_waiting_for_code_no_worker_serves(admin_client, unserved, sample):
    execution_id, digest, mine = unserved
    component = ComponentId(component_type="activity", name=sample.package, component_digest=digest)
    scenarios.pinned(sample.ffqn("add"), [3, 4], component, mine)
    body = admin_client.get(reverse("admin:index")).content.decode()
    assert "waiting for code no worker serves" in body
    assert 'data-count="not-served"><a href="#obelisk-not-served"><span class="n">2</span>' in body
    assert f'<tr data-digest="{digest}">' in body
    assert f"component={digest.replace(':', '%3A')}" in body  # the list of that component's executions
    heartbeat("host:2:A", mine)
    assert 'id="obelisk-not-served"' not in admin_client.get(reverse("admin:index")).content.decode()


def test_a_blocked_workflows_backtrace_shows_its_source_lines_from_the_stored_files(admin_client, sample):
    deployment_id = scenarios.create_deployment(sample)  # stores the files and the frame mapping
    welcome = load_deployment(deployment_id)[sample.ffqn("welcome")]
    stored = scenarios.blocked_workflow(welcome, "ada", deployment_id)
    body = page_of(admin_client, stored)
    assert 'id="obelisk-backtraces"' in body
    assert f"{sample.package}/workflows.py:8 in welcome</pre>" in body
    # The frame's line with the lines before it, which only the stored file has.
    assert "    6   @workflow\n    7   def welcome(ctx, name: str) -&gt; str:\n" in body
    assert '<b class="obelisk-source-line">    8 →     return ctx.call(greet, name)</b></pre>' in body

    other = scenarios.old_deployment(sample)  # no files stored for its digests
    old = ComponentId(
        component_type="workflow",
        name=sample.workflow_component,
        component_digest=scenarios.old_digest(sample.workflow_component + "v0"),
    )
    unstored = scenarios.blocked_workflow(welcome, "bob", other, old)
    body = page_of(admin_client, unstored)
    assert "workflows.py:8 in welcome: return ctx.call(greet, name)" in body  # as before: the worker's line
    assert 'class="obelisk-source"' not in body


@pytest.fixture
def upgrade(sample):
    to_id = scenarios.create_deployment(sample)
    return scenarios.upgrade_scenario(sample, to_id)


def report_url(scenario) -> str:
    return reverse("obelisk_upgrade_dry_run", args=[scenario.from_id]) + f"?to={scenario.to_id}"


def test_a_deployments_page_offers_the_dry_run_to_the_deployments_sharing_a_component(admin_client, upgrade):
    from executions import store

    unrelated = scenarios.other_deployment("t5_unrelated")
    store.activate_deployment(upgrade.to_id)
    body = admin_client.get(
        reverse("admin:obelisk_deployments_deployment_change", args=[upgrade.from_id])
    ).content.decode()
    assert f'action="{reverse("obelisk_upgrade_dry_run", args=[upgrade.from_id])}"' in body
    assert f'<option value="{upgrade.to_id}" selected>' in body
    assert unrelated not in body
    assert 'id="obelisk-upgrade-dry-run"' in body
    lonely = admin_client.get(reverse("admin:obelisk_deployments_deployment_change", args=[unrelated]))
    assert 'id="obelisk-upgrade-none"' in lonely.content.decode()


def test_the_report_page_is_the_dry_runs_table_and_writes_nothing(admin_client, upgrade):
    from tests.support import helpers

    before = helpers.db_snapshot()
    response = admin_client.get(report_url(upgrade))
    assert response.status_code == 200
    body = response.content.decode()
    assert '<span id="obelisk-clean-count">3</span> clean' in body
    assert '<span id="obelisk-nondeterministic-count">1</span> nondeterministic' in body
    for execution_id in upgrade.clean:
        assert f'<tr class="obelisk-upgrade-row clean" data-execution="{execution_id}">' in body
    (bad,) = upgrade.nondeterministic
    assert f'<tr class="obelisk-upgrade-row nondeterministic" data-execution="{bad}">' in body
    assert reverse("admin:obelisk_executions_executionstate_change", args=[bad]) in body
    assert "key does not match event stored at version 2" in body
    assert helpers.db_snapshot() == before


def test_the_report_page_says_why_when_it_cannot_run_and_is_for_staff_who_may_view_deployments(client, upgrade):
    from executions import store

    support.make_admin()
    client.login(username="admin", password=support.ADMIN_PASSWORD)
    unrelated = scenarios.other_deployment("t5_unrelated")
    response = client.get(reverse("obelisk_upgrade_dry_run", args=[unrelated]) + f"?to={upgrade.to_id}")
    assert response.status_code == 400 and "no_shared_component" in response.content.decode()
    for query in ("", "?to=Dep_/x", "?to=Dep_%00"):
        refused = client.get(reverse("obelisk_upgrade_dry_run", args=[upgrade.from_id]) + query)
        assert refused.status_code == 400 and "invalid_id" in refused.content.decode(), query
    client.logout()
    assert client.get(report_url(upgrade)).status_code == 302  # to the admin's login
    support.make_viewer()  # staff who may view executions, not deployments
    client.login(username="viewer", password="viewer")
    assert client.get(report_url(upgrade)).status_code == 403
    assert store.get_state(upgrade.clean[0]).deployment_id != upgrade.to_id  # nothing moved
