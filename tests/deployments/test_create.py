"""``obelisk_deploy create``: the same manifest and code give one deployment, stored whole
(components with their exports and settings, source files, the frame mapping); bad input
is one line naming the file, line and key, and creates nothing."""

from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connections

from deployments.manifest import read_manifest
from executions import store
from executions.models import ComponentMetadata, ComponentSource, Deployment, DeploymentComponent, DeploymentFile, File
from tests.deployments.sample import MANIFEST


def create(path) -> str:
    from io import StringIO

    out = StringIO()
    call_command("obelisk_deploy", "create", str(path), stdout=out)
    return out.getvalue().strip()


def nothing_stored() -> bool:
    tables = (Deployment, DeploymentComponent, ComponentMetadata, DeploymentFile, File, ComponentSource)
    return all(not model.objects.exists() for model in tables)


@pytest.mark.django_db
def test_the_same_manifest_and_code_give_the_same_deployment(sample):
    first = create(sample.manifest)
    assert first.startswith("Dep_")
    assert create(sample.manifest) == first
    sample.manifest.write_text("# a comment changes nothing\n" + sample.manifest.read_text())
    assert create(sample.manifest) == first
    assert Deployment.objects.count() == 1
    sample.manifest.write_text(sample.manifest.read_text().replace('timeout = "5s"', 'timeout = "6s"'))
    assert create(sample.manifest) != first
    assert Deployment.objects.count() == 2


@pytest.mark.django_db
def test_changed_code_gives_another_deployment(sample):
    first = create(sample.manifest)
    activities = sample.directory / sample.package / "activities.py"
    activities.write_text(activities.read_text() + "\n# changed\n")
    assert create(sample.manifest) != first


@pytest.mark.django_db
def test_a_deployment_stores_its_components_files_and_frame_mapping(sample):
    deployment_id = create(sample.manifest)
    record = store.get_deployment_record(deployment_id)
    assert record.toml == sample.manifest.read_text()
    assert record.description == "sample"
    assert [(c["name"], c["type"]) for c in record.components] == [
        (sample.package, "activity"),
        (f"{sample.package}:workflow", "workflow"),
    ]
    exports = {e["ffqn"]: e for c in record.components for e in c["exports"]}
    greet = exports[sample.ffqn("greet")]
    assert greet["parameter_types"] == [{"name": "name", "type": {"type": "string"}}]
    assert greet["return_type"] == {"type": "string"}
    assert greet["settings"] == {"max_retries": 5, "backoff": "100ms", "timeout": "1m", "lock_duration": "10s"}
    assert exports[sample.ffqn("welcome")]["settings"]["blocking"] == "await"
    paths = [path for path, _ in record.files]
    assert paths == [f"{sample.package}/{name}" for name in ("__init__.py", "activities.py", "workflows.py")]
    source = (sample.directory / sample.package / "activities.py").read_bytes()
    digest = dict(record.files)[f"{sample.package}/activities.py"]
    assert store.read_file(digest) == source
    frame = f"/srv/elsewhere/checkout/{sample.package}/activities.py"
    workflow_digest = record.components[1]["digest"]
    assert store.resolve_source_digest(workflow_digest, frame) == digest
    assert store.resolve_source_digest(workflow_digest, "/srv/other.py") is None


@pytest.mark.django_db
def test_show_prints_the_effective_settings(sample):
    from io import StringIO

    deployment_id = create(sample.manifest)
    out = StringIO()
    call_command("obelisk_deploy", "show", deployment_id, stdout=out)
    text = out.getvalue()
    assert f"deployment {deployment_id} (inactive)" in text
    assert (
        f"  {sample.ffqn('greet')} [{sample.package}] backoff=250ms lock_duration=10s max_retries=3 timeout=5s" in text
    )
    assert (
        f"  {sample.ffqn('add')} [{sample.package}] backoff=100ms lock_duration=10s max_retries=3 timeout=30s" in text
    )
    assert "blocking=await" in text


def bad(sample, text: str | None = None, *, activities: str | None = None) -> str:
    if text is not None:
        sample.manifest.write_text(text.format(package=sample.package))
    if activities is not None:
        (sample.directory / sample.package / "activities.py").write_text(activities)
    with pytest.raises(CommandError) as raised:
        create(sample.manifest)
    assert nothing_stored()
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.django_db
def test_an_unknown_module_is_named_with_its_line(sample):
    text = '[[component]]\nmodule = "{package}"\n\n[[component]]\nmodule = "no_such_package_t4.jobs"\n'
    message = bad(sample, text)
    assert message == (
        f"invalid_manifest: {sample.manifest}:5: component[1].module: unknown module: no module named `no_such_package_t4`"
    )


@pytest.mark.django_db
def test_a_module_that_fails_to_import_is_named(sample):
    message = bad(sample, activities="raise RuntimeError('no config')\n")
    assert message.startswith(f"invalid_manifest: {sample.manifest}:4: component[0].module: ")
    assert f"`{sample.package}.activities` fails to import: RuntimeError: no config" in message


@pytest.mark.django_db
def test_duplicate_function_names_are_refused(sample):
    duplicate = f"""\
from workers.activity import activity


@activity(name="py:{sample.package}/activities.greet")
def greet_again(name: str) -> str:
    return name
"""
    (sample.directory / sample.package / "more.py").write_text(duplicate)
    message = bad(sample)
    assert "duplicate function name" in message or "already registered" in message
    assert f"py:{sample.package}/activities.greet" in message
    assert message.startswith(f"invalid_manifest: {sample.manifest}:4: component[0].module: ")


@pytest.mark.django_db
def test_settings_of_an_unknown_function_are_refused(sample):
    text = MANIFEST.replace("activities.greet", "activities.gret")
    message = bad(sample, text)
    assert message.startswith(
        f'invalid_manifest: {sample.manifest}:8: component[0].functions."py:{sample.package}/activities.gret": unknown function'
    )


@pytest.mark.django_db
def test_blocking_of_an_activity_is_refused(sample):
    text = MANIFEST.replace('backoff = "250ms"', 'blocking = "interrupt"')
    message = bad(sample, text)
    assert message.startswith(
        f'invalid_manifest: {sample.manifest}:10: component[0].functions."py:{sample.package}/activities.greet".blocking: '
        "blocking applies to workflows only"
    )


@pytest.mark.django_db
def test_an_ill_typed_setting_and_invalid_toml_are_refused(sample):
    assert bad(sample, MANIFEST.replace('timeout = "30s"', "timeout = 30")).startswith(
        f"invalid_manifest: {sample.manifest}:6: component[0].timeout: must be a duration"
    )
    assert bad(sample, MANIFEST.replace('"30s"', '"30s')).startswith(
        f"invalid_manifest: {sample.manifest}:6: invalid TOML"
    )
    missing = sample.manifest.parent / "missing.toml"
    with pytest.raises(CommandError, match="cannot read the manifest"):
        create(missing)


@pytest.mark.postgres_only
@pytest.mark.django_db(transaction=True)
def test_racing_creates_give_one_deployment(sample):
    from workers.components import new_deployment

    new = new_deployment(read_manifest(sample.manifest))
    barrier, results, failures = threading.Barrier(4), [], []

    def race():
        try:
            barrier.wait()
            results.append(store.create_deployment(new))
        except Exception as error:  # reported below
            failures.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert len({deployment_id for deployment_id, _ in results}) == 1
    assert sorted(created for _, created in results) == [False, False, False, True]
    assert Deployment.objects.count() == 1
    assert DeploymentFile.objects.count() == 3


@pytest.mark.django_db
def test_a_component_that_imports_another_components_functions_exports_only_its_own(sample):
    """The demo's shape: the workflows module imports the activities it calls. Listed as two
    components, each exports its own functions (the import is not a duplicate)."""
    sample.manifest.write_text(
        f'[[component]]\nmodule = "{sample.package}.activities"\n\n'
        f'[[component]]\nmodule = "{sample.package}.workflows"\n'
    )
    record = store.get_deployment_record(create(sample.manifest))
    exported = {c["name"]: sorted(f["ffqn"] for f in c["exports"]) for c in record.components}
    assert exported == {
        f"{sample.package}.activities": [sample.ffqn("add"), sample.ffqn("greet")],
        f"{sample.package}.workflows:workflow": [sample.ffqn("welcome")],
    }


def test_the_demo_manifest_creates_its_deployment(db):
    """README's "Deploying new code" creates ``demo/obelisk.toml``."""
    from tests.deployments.sample import forget_package

    try:
        deployment_id = create("demo/obelisk.toml")
        assert create("demo/obelisk.toml") == deployment_id
        names = {c["name"] for c in store.get_deployment_record(deployment_id).components}
        assert names == {"demo.activities", "demo.workflows:workflow"}
    finally:
        for module in ("demo.activities", "demo.workflows"):  # later tests serve every registered function
            forget_package(module)  # (demo/tests, a test package of its own, keeps its functions)
