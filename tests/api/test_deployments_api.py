"""The deployment routes of the REST API (issue 38): creating a deployment from a manifest
(idempotent, and refused with the file, line and key of a mistake), activating one, the
upgrade's dry run and the upgrade itself over executions pinned through the store, and an
execution's ``waiting_for`` when no live cluster serves its code. Through Django's test
client, the real URL conf, views and database."""

from __future__ import annotations

import pytest
from django.utils import timezone

from executions import store
from executions.events import ComponentId
from executions.models import Deployment
from tests.support import deployments as scenarios
from tests.support import helpers
from tests.support.api import ACT, VIEW, Api, api_for, assert_error, make_user

pytestmark = pytest.mark.django_db(transaction=True)  # workflows run in threads

UNKNOWN = "Dep_01JAAAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture
def sample(tmp_path, monkeypatch):
    code = scenarios.sample_code(tmp_path, monkeypatch)
    yield code
    scenarios.forget(code)


@pytest.fixture
def deployer() -> Api:
    """May read and act: create, activate and upgrade deployments."""
    return api_for(make_user("dora", VIEW, ACT))


def create(api: Api, manifest: str):
    return api.post("/deployments", {"manifest": manifest})


def test_creating_a_deployment_is_201_then_200_with_the_same_deployment(deployer, sample):
    first = create(deployer, sample.manifest)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["deployment_id"].startswith("Dep_") and body["manifest"] == sample.manifest
    assert body["created_by"] == "dora" and body["status"] == "inactive"
    names = {(c["name"], c["type"]) for c in body["components"]}
    assert names == {(sample.package, "activity"), (sample.workflow_component, "workflow")}
    again = create(deployer, sample.manifest)
    assert again.status_code == 200, again.content
    assert again.json()["deployment_id"] == body["deployment_id"]
    assert Deployment.objects.count() == 1
    assert deployer.get(f"/deployments/{body['deployment_id']}").json()["digest"] == body["digest"]


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda text: text.replace('timeout = "5s"', 'timeout = "five"'), ("obelisk.toml:9", "timeout")),
        (lambda text: text + '\n[[component]]\nmodule = "no_such_module_t5"\n', ("obelisk.toml:13", "module")),
        (lambda text: 'description = "x"\n\n[[component]]\nmodule = "antigravity"\n', ("obelisk.toml:4", "module")),
        (lambda text: text.replace("[[component]]", "[[component]"), ("obelisk.toml:3", "")),
    ],
    ids=["ill-typed-setting", "unknown-module", "standard-library", "invalid-toml"],
)
def test_a_bad_manifest_is_400_naming_file_line_and_key_and_stores_nothing(deployer, sample, change, where):
    response = create(deployer, change(sample.manifest))
    message = assert_error(response, 400, "invalid_manifest")["message"]
    location, key = where
    assert message.startswith(location), message
    assert key in message
    assert Deployment.objects.count() == 0


def test_creating_and_activating_need_the_act_permission_and_the_body_is_strict(deployer, sample):
    viewer = api_for(make_user("vic", VIEW))
    assert_error(create(viewer, sample.manifest), 403, "forbidden")
    assert_error(deployer.post("/deployments", {"manifest": sample.manifest, "x": 1}), 422, "validation_failed")
    created = create(deployer, sample.manifest).json()["deployment_id"]
    assert_error(viewer.post(f"/deployments/{created}/activate"), 403, "forbidden")
    activated = deployer.post(f"/deployments/{created}/activate")
    assert activated.status_code == 200 and activated.json()["status"] == "active"
    assert store.current_deployment() == (created, "active")
    assert_error(deployer.post(f"/deployments/{UNKNOWN}/activate"), 404, "not_found")
    assert_error(deployer.post("/deployments/Dep_nope/activate"), 400, "invalid_id")


@pytest.fixture
def upgrade(deployer, sample) -> scenarios.UpgradeScenario:
    to_id = create(deployer, sample.manifest).json()["deployment_id"]
    return scenarios.upgrade_scenario(sample, to_id)


def upgrade_path(scenario, *, dry_run: bool) -> str:
    return f"/deployments/{scenario.from_id}/upgrade?to={scenario.to_id}" + ("&dry_run=true" if dry_run else "")


def test_a_dry_run_reports_the_clean_and_the_nondeterministic_and_writes_nothing(api, upgrade):
    before = helpers.db_snapshot()
    response = api.post(upgrade_path(upgrade, dry_run=True))
    assert response.status_code == 200, response.content
    report = response.json()
    assert (report["from_deployment"], report["to_deployment"]) == (upgrade.from_id, upgrade.to_id)
    assert (report["clean"], report["nondeterministic"]) == (3, 1)
    verdicts = {v["execution_id"]: v for v in report["executions"]}
    assert set(verdicts) == set(upgrade.in_flight)
    assert all(verdicts[e]["clean"] and verdicts[e]["message"] is None for e in upgrade.clean)
    (bad,) = upgrade.nondeterministic
    assert not verdicts[bad]["clean"] and "does not match" in verdicts[bad]["message"]
    assert "o:1-add" in verdicts[bad]["message"] and "o:1-greet" in verdicts[bad]["message"]  # side by side
    activity = [v for v in report["executions"] if v["note"]]
    assert len(activity) == 1 and activity[0]["ffqn"] == upgrade.sample.ffqn("greet")
    assert helpers.db_snapshot() == before


def test_an_upgrade_moves_only_the_clean_ones_and_needs_the_act_permission(api, upgrade):
    viewer = api_for(make_user("vic", VIEW))
    assert_error(viewer.post(upgrade_path(upgrade, dry_run=False)), 403, "forbidden")
    assert viewer.post(upgrade_path(upgrade, dry_run=True)).status_code == 200
    old = {e: store.get_state(e).component_id_input_digest for e in upgrade.in_flight}
    response = api.post(upgrade_path(upgrade, dry_run=False))
    assert response.status_code == 200, response.content
    body = response.json()
    assert sorted(body["moved"]) == sorted(upgrade.clean) and body["refused"] == []
    assert (body["report"]["clean"], body["report"]["nondeterministic"]) == (3, 1)
    for execution_id in upgrade.clean:
        state = store.get_state(execution_id)
        assert state.component_id_input_digest != old[execution_id]
        assert state.deployment_id == upgrade.to_id
    (bad,) = upgrade.nondeterministic
    assert store.get_state(bad).component_id_input_digest == old[bad]
    again = api.post(upgrade_path(upgrade, dry_run=True)).json()
    assert [v["execution_id"] for v in again["executions"]] == [bad]


def test_an_upgrade_between_unknown_or_unrelated_deployments_is_refused(api, upgrade):
    assert_error(api.post(f"/deployments/{UNKNOWN}/upgrade?to={upgrade.to_id}&dry_run=true"), 404, "unknown_deployment")
    assert_error(api.post(f"/deployments/{upgrade.from_id}/upgrade?to={UNKNOWN}"), 404, "unknown_deployment")
    assert_error(api.post(f"/deployments/{upgrade.from_id}/upgrade?to=Dep_x&dry_run=true"), 400, "invalid_id")
    unrelated = scenarios.other_deployment("t5_unrelated")
    before = helpers.db_snapshot()
    for dry_run in ("true", "false"):
        response = api.post(f"/deployments/{unrelated}/upgrade?to={upgrade.to_id}&dry_run={dry_run}")
        assert "share no component" in assert_error(response, 400, "no_shared_component")["message"]
    assert_error(api.post(f"/deployments/{upgrade.from_id}/upgrade"), 422, "validation_failed")
    assert helpers.db_snapshot() == before


def test_a_dry_run_against_code_this_server_does_not_import_is_409(api, upgrade):
    newer = scenarios.old_deployment(upgrade.sample, tag="v2")  # same names, digests nobody imports
    response = api.post(f"/deployments/{upgrade.from_id}/upgrade?to={newer}&dry_run=true")
    assert "component" in assert_error(response, 409, "deployment_mismatch")["message"]


def heartbeat(cluster_id: str, deployment_id: str) -> None:
    now = timezone.now()
    store.record_heartbeat(
        cluster_id,
        hostname="h",
        pid=1,
        started_at=now,
        processes=1,
        running=0,
        functions=[],
        deployment_id=deployment_id,
    )


def test_waiting_for_says_when_no_live_cluster_serves_an_executions_code(api, sample):
    served = scenarios.other_deployment("t5_served")
    mine = scenarios.old_deployment(sample)
    digest = scenarios.old_digest(sample.package + "v0")
    component = ComponentId(component_type="activity", name=sample.package, component_digest=digest)
    execution_id = scenarios.pinned(sample.ffqn("add"), [1, 2], component, mine)
    assert api.get(f"/executions/{execution_id}").json()["waiting_for"] is None  # no cluster alive at all
    heartbeat("h:1:A", served)
    waiting = api.get(f"/executions/{execution_id}").json()["waiting_for"]
    assert waiting == f"waiting for component {digest} (not served)"
    heartbeat("h:2:B", mine)
    assert api.get(f"/executions/{execution_id}").json()["waiting_for"] is None
