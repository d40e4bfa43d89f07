"""What a worker serves (``workers.components.serve``): a manifest deployment's functions
with its settings and components; the imported modules when there is none."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command

from executions import store
from executions.models import Deployment
from workers.components import DeploymentMismatch, load_deployment, serve
from workers.registry import lookup


def create(manifest) -> str:
    out = StringIO()
    call_command("obelisk_deploy", "create", str(manifest), stdout=out)
    return out.getvalue().strip()


@pytest.mark.django_db
def test_a_deployment_applies_its_settings_over_the_decorators(sample):
    deployment_id = create(sample.manifest)
    functions = load_deployment(deployment_id)
    assert sorted(functions) == sorted(sample.ffqn(n) for n in ("add", "greet", "welcome"))
    greet, add, welcome = (functions[sample.ffqn(n)] for n in ("greet", "add", "welcome"))
    assert (greet.timeout, greet.backoff, greet.max_retries) == (timedelta(seconds=5), timedelta(milliseconds=250), 3)
    assert (add.timeout, add.backoff, add.max_retries) == (timedelta(seconds=30), timedelta(milliseconds=100), 3)
    assert (welcome.max_retries, welcome.blocking) == (3, "await")
    stored = {c["name"]: c["digest"] for c in store.get_deployment_record(deployment_id).components}
    assert greet.component_id.name == sample.package
    assert greet.component_id.component_digest == stored[sample.package]
    assert welcome.component_id.component_digest == stored[f"{sample.package}:workflow"]
    assert lookup(sample.ffqn("greet")) is greet  # a workflow's call of it sees the same settings


@pytest.mark.django_db
def test_without_a_manifest_deployment_the_imported_modules_are_served():
    deployment_id, functions = serve()
    assert "test:acts/basic.noop" in functions
    assert Deployment.objects.get(pk=deployment_id).status == "active"
    assert serve()[0] == deployment_id  # the same code, the same deployment
    assert load_deployment(deployment_id).keys() == functions.keys()


@pytest.mark.django_db
def test_the_current_manifest_deployment_is_served_and_an_enqueued_one_confirmed(sample):
    code_deployment, _ = serve()
    deployment_id = create(sample.manifest)
    store.enqueue_deployment(deployment_id)
    served, functions = serve()
    assert served == deployment_id and sample.ffqn("greet") in functions
    assert Deployment.objects.get(pk=deployment_id).status == "active"
    assert Deployment.objects.get(pk=code_deployment).status == "inactive"


@pytest.mark.django_db
def test_code_that_changed_since_the_deployment_is_refused(sample):
    deployment_id = create(sample.manifest)
    workflows = sample.directory / sample.package / "workflows.py"
    workflows.write_text(workflows.read_text() + "\n# edited\n")
    with pytest.raises(DeploymentMismatch, match=f"component `{sample.package}` is sha256:"):
        load_deployment(deployment_id)
