"""A deployment's status: ``activate`` at once, ``enqueue`` until a worker serving it
confirms; unknown ids are one-line errors; ``gc`` deletes only the files no deployment
references; ``diff`` names the components, functions and settings that changed."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from executions import store
from executions.ids import content_digest, new_deployment_id
from executions.models import Deployment, File
from tests.deployments.sample import forget_modules


def deploy(*args) -> str:
    out = StringIO()
    call_command("obelisk_deploy", *args, stdout=out)
    return out.getvalue().strip()


def status(deployment_id: str) -> str:
    return Deployment.objects.get(pk=deployment_id).status


def make(n: int) -> str:
    """A stored deployment of one empty component, distinct by ``n``."""
    new = store.NewDeployment(
        toml=f"# {n}\n",
        digest=content_digest(f"deployment {n}".encode()),
        obelisk_version="test",
        components=[{"name": f"m{n}", "type": "activity", "digest": content_digest(f"m{n}".encode()), "exports": []}],
        files=[(f"m{n}.py", f"# file {n}\n".encode()), ("shared.py", b"# shared\n")],
        sources=[(content_digest(f"m{n}".encode()), f"m{n}.py")],
    )
    return store.create_deployment(new)[0]


@pytest.mark.django_db
def test_an_enqueued_deployment_becomes_active_when_a_worker_confirms_it():
    old, new = make(1), make(2)
    assert deploy("activate", old) == f"{old} is active"
    assert deploy("enqueue", new).startswith(f"{new} is enqueued")
    assert (status(old), status(new)) == ("active", "enqueued")
    assert store.current_deployment() == (new, "enqueued")
    assert store.confirm_deployment(new) == "active"
    assert (status(old), status(new)) == ("inactive", "active")
    assert Deployment.objects.get(pk=new).last_active_at is not None
    assert store.confirm_deployment(new) == "active"  # a second worker changes nothing
    assert store.confirm_deployment(old) == "inactive"  # serving an old one (draining) does not activate it
    assert deploy("enqueue", new) == f"{new} is already active"


@pytest.mark.django_db
def test_enqueueing_another_replaces_the_enqueued_one():
    first, second = make(1), make(2)
    deploy("enqueue", first)
    deploy("enqueue", second)
    assert (status(first), status(second)) == ("inactive", "enqueued")
    deploy("activate", first)
    assert (status(first), status(second)) == ("active", "inactive")
    assert store.current_deployment() == (first, "active")


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["activate", "enqueue", "show"])
def test_an_unknown_deployment_is_a_one_line_error(action):
    unknown = new_deployment_id()
    with pytest.raises(CommandError) as raised:
        deploy(action, unknown)
    assert str(raised.value) == f"not_found: unknown deployment `{unknown}`"
    assert raised.value.returncode == 1
    with pytest.raises(CommandError, match="^invalid_id: "):
        deploy(action, "nonsense")


@pytest.mark.django_db
def test_gc_deletes_only_files_no_deployment_references():
    make(1), make(2)
    orphan = File.store_objects.create(digest=content_digest(b"orphan"), content=b"orphan", size=6)
    kept = set(File.objects.values_list("digest", flat=True)) - {orphan.digest}
    assert deploy("gc") == "deleted 1 orphan file(s)"
    assert set(File.objects.values_list("digest", flat=True)) == kept
    assert len(kept) == 3  # m1.py, m2.py and the shared file, once
    assert deploy("gc") == "deleted 0 orphan file(s)"


@pytest.mark.django_db
def test_list_shows_every_deployment_with_its_status():
    first, second = make(1), make(2)
    deploy("activate", second)
    lines = deploy("list").splitlines()
    assert len(lines) == 2
    assert any(line.startswith(f"{second}  active") for line in lines)
    assert any(line.startswith(f"{first}  inactive") for line in lines)


@pytest.mark.django_db
def test_diff_names_the_components_functions_and_settings_that_changed(sample):
    before = deploy("create", str(sample.manifest))
    text = sample.manifest.read_text().replace('timeout = "5s"', 'timeout = "7s"').replace("max_retries = 3", "")
    sample.manifest.write_text(text)
    workflows = sample.directory / sample.package / "workflows.py"
    workflows.write_text(
        workflows.read_text() + "\n\n@workflow\ndef farewell(ctx, name: str) -> str:\n    return name\n"
    )
    forget_modules(sample.package)  # a new process would import the changed code
    after = deploy("create", str(sample.manifest))
    lines = deploy("diff", before, after).splitlines()
    changed = [line for line in lines if line.startswith("~ component")]
    assert [line.split()[2] for line in changed] == [sample.package, f"{sample.package}:workflow"]
    assert f"+ function py:{sample.package}/workflows.farewell [{sample.package}:workflow]" in lines
    assert f"~ function {sample.ffqn('greet')} timeout: 5s -> 7s" in lines
    assert f"~ function {sample.ffqn('greet')} max_retries: 3 -> 5" in lines
    assert f"~ function {sample.ffqn('add')} max_retries: 3 -> 5" in lines
    assert f"~ function {sample.ffqn('welcome')} max_retries: 3 -> forever" in lines  # the decorator's default
    assert deploy("diff", before, before) == "no difference"
