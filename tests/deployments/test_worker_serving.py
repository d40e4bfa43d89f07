"""Workers serve the current deployment, with its settings, and refuse code that is not it.

Real ``manage.py obelisk_worker`` processes on the test database (so the tests are
transactional): a worker serving an enqueued deployment confirms it (it becomes active) and
runs its functions with the manifest's settings; one whose checkout differs from the
deployment (``--deployment ID``, or the current one) refuses to start and names the
component and both digests."""

from __future__ import annotations

import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from executions import client, store
from executions.events import Locked
from executions.models import Deployment
from tests.support.clusters import current_database_url, started_clusters

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def create(manifest) -> str:
    out = StringIO()
    call_command("obelisk_deploy", "create", str(manifest), stdout=out)
    return out.getvalue().strip()


def worker_env(sample) -> dict:
    return {"PYTHONPATH": str(sample.directory), "OBELISK_COMPONENT_MODULES": ""}


def start_refused(sample, *arguments) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        **worker_env(sample),
        "DJANGO_SETTINGS_MODULE": "obelisk_site.settings",
        "DATABASE_URL": current_database_url(),
    }
    command = [sys.executable, "manage.py", "obelisk_worker", "--workers", "1", *arguments]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_worker_serves_the_enqueued_deployment_with_its_settings(sample, request, tmp_path):
    deployment_id = create(sample.manifest)
    store.enqueue_deployment(deployment_id)
    with started_clusters(request, tmp_path, default_env=worker_env(sample)) as start:
        cluster = start()
        assert f"deployment {deployment_id}" in cluster.log()
        assert Deployment.objects.get(pk=deployment_id).status == "active"
        submitted = client.submit(sample.ffqn("greet"), ["ada"], deployment_id=deployment_id)
        assert client.wait(submitted.execution_id, timeout=60) == {"ok": "hello ada"}
    events, _ = store.list_events(submitted.execution_id)
    locked = next(record.event for record in events if isinstance(record.event, Locked))
    assert locked.deployment_id == deployment_id
    assert locked.component_id.name == sample.package
    assert locked.retry_config.max_retries == 3  # the manifest's, not the decorator's 5
    assert locked.retry_config.retry_exp_backoff.total_seconds() == 0.25


@pytest.mark.parametrize("how", ["--deployment", "current"])
def test_a_worker_refuses_code_that_is_not_the_deployment(sample, how):
    deployment_id = create(sample.manifest)
    expected = {c["name"]: c["digest"] for c in store.get_deployment_record(deployment_id).components}
    activities = sample.directory / sample.package / "activities.py"
    activities.write_text(activities.read_text() + "\n# edited after the deployment\n")
    if how == "current":
        store.activate_deployment(deployment_id)
    done = start_refused(sample, *(["--deployment", deployment_id] if how == "--deployment" else []))
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    message = lines[0]
    assert message.startswith(
        f"CommandError: the code here is not deployment {deployment_id}: component `{sample.package}`"
    )
    assert expected[sample.package] in message
    assert message.count("sha256:") == 2
    assert "Traceback" not in done.stderr and "broker serving" not in done.stdout
    assert Deployment.objects.get(pk=deployment_id).status == ("active" if how == "current" else "inactive")


def test_an_unknown_deployment_is_refused_in_one_line(sample):
    done = start_refused(sample, "--deployment", "Dep_01JAAAAAAAAAAAAAAAAAAAAAAA")
    assert done.returncode != 0
    assert done.stderr.strip() == "CommandError: unknown deployment `Dep_01JAAAAAAAAAAAAAAAAAAAAAAA`"
