"""Deployments and in-flight executions for the tests of issue 38's faces (the API's
deployment routes, the console's dry-run report, "not served", the stored source line).

``SampleCode`` is a fresh package (``tests/deployments/sample.py``: activities ``greet`` and
``add``, the workflow ``welcome``) on ``sys.path`` with its manifest. ``old_deployment``
stores a deployment of the *same component names* with other digests, as an earlier version
of that code would have (its code is not needed: a dry run loads the target's only).
``upgrade_scenario`` pins executions to it: workflows run by the new code through the
worker's path (``run_workflow``, Interrupt, so each stops blocked on its child) replay
cleanly; one run by other code (it calls ``add`` where ``welcome`` calls ``greet``) holds
events the new code would not produce; a pending activity has no history to replay.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from deployments.manifest import parse_manifest
from deployments.registration import OBELISK_VERSION
from executions import store
from executions.events import ComponentId
from executions.ids import ExecutionId, content_digest
from tests.deployments.sample import forget_package, new_package_name, write_manifest, write_package
from tests.support import workflow_runs
from workers.components import load_deployment, new_deployment


@dataclass
class SampleCode:
    directory: Path
    package: str
    manifest: str  # the text of its obelisk.toml

    def ffqn(self, name: str) -> str:
        module = "workflows" if name == "welcome" else "activities"
        return f"py:{self.package}/{module}.{name}"

    @property
    def workflow_component(self) -> str:
        return f"{self.package}:workflow"


def sample_code(tmp_path: Path, monkeypatch) -> SampleCode:
    """A new sample package importable from ``tmp_path/code``; ``forget`` it afterwards."""
    package = new_package_name()
    code = tmp_path / "code"
    write_package(code, package)
    monkeypatch.syspath_prepend(str(code))
    return SampleCode(code, package, write_manifest(tmp_path, package).read_text())


def forget(sample: SampleCode) -> None:
    forget_package(sample.package)


def create_deployment(sample: SampleCode) -> str:
    """The sample's deployment, stored with its files and frame mapping, as ``obelisk_deploy create`` does."""
    deployment_id, _ = store.create_deployment(new_deployment(parse_manifest(sample.manifest)))
    return deployment_id


def old_digest(what: str) -> str:
    return content_digest(f"an earlier version of {what}".encode())


def old_deployment(sample: SampleCode, *, tag: str = "v0") -> str:
    """A deployment naming the sample's components with other digests (an earlier version)."""
    components = [
        {"name": sample.package, "type": "activity", "digest": old_digest(sample.package + tag), "exports": []},
        {
            "name": sample.workflow_component,
            "type": "workflow",
            "digest": old_digest(sample.workflow_component + tag),
            "exports": [],
        },
    ]
    deployment_id, _ = store.create_deployment(
        store.NewDeployment(
            toml=f'description = "{sample.package} {tag}"\n',
            digest=content_digest(f"{sample.package} {tag}".encode()),
            obelisk_version=OBELISK_VERSION,
            description=f"{sample.package} {tag}",
            components=components,
        )
    )
    return deployment_id


def other_deployment(name: str) -> str:
    """A deployment sharing no component with the sample's."""
    deployment_id, _ = store.create_deployment(
        store.NewDeployment(
            toml=f'description = "{name}"\n',
            digest=content_digest(name.encode()),
            obelisk_version=OBELISK_VERSION,
            components=[{"name": name, "type": "activity", "digest": old_digest(name), "exports": []}],
        )
    )
    return deployment_id


def pinned(ffqn: str, params: list, component: ComponentId, deployment_id: str) -> str:
    """A new top-level execution pinned to ``component`` of ``deployment_id``."""
    execution_id = str(ExecutionId.generate())
    store.create(
        store.CreateRequest(
            execution_id=execution_id, ffqn=ffqn, params=params, component_id=component, deployment_id=deployment_id
        )
    )
    return execution_id


def blocked_workflow(spec, name: str, deployment_id: str, component: ComponentId | None = None) -> str:
    """``spec`` (``welcome`` or other code under its name) run once through the worker's
    path (``run_workflow``, Interrupt) as a worker of ``component`` (a lock pins the
    execution to the locker's component): it stops blocked on its child, with its backtrace."""
    if component is not None:
        spec = replace(spec, _component=component)
    execution_id = pinned(spec.ffqn, spec.encode_arguments([name]), spec.component_id, deployment_id)
    workflow_runs.run_root(execution_id, spec, None, blocking="interrupt")
    state = store.get_state(execution_id)
    assert state.state == "blocked_by_join_set", state.state
    return execution_id


@dataclass
class UpgradeScenario:
    sample: SampleCode
    from_id: str
    to_id: str
    clean: list[str] = field(default_factory=list)
    nondeterministic: list[str] = field(default_factory=list)

    @property
    def in_flight(self) -> list[str]:
        return self.clean + self.nondeterministic


def upgrade_scenario(sample: SampleCode, to_id: str, *, clean_workflows: int = 2) -> UpgradeScenario:
    """FROM (``old_deployment``) with ``clean_workflows`` + 1 clean executions (the activity)
    and 1 nondeterministic one pinned to it; TO is ``to_id``, the sample's own code."""
    functions = load_deployment(to_id)
    welcome = functions[sample.ffqn("welcome")]
    from_id = old_deployment(sample)
    old_workflow = ComponentId(
        component_type="workflow",
        name=sample.workflow_component,
        component_digest=old_digest(sample.workflow_component + "v0"),
    )
    old_activity = ComponentId(
        component_type="activity", name=sample.package, component_digest=old_digest(sample.package + "v0")
    )
    scenario = UpgradeScenario(sample, from_id, to_id)
    for index in range(clean_workflows):
        scenario.clean.append(blocked_workflow(welcome, f"ada {index}", from_id, old_workflow))
    greet = functions[sample.ffqn("greet")]
    scenario.clean.append(pinned(greet.ffqn, greet.encode_arguments(["grace"]), old_activity, from_id))
    add = importlib.import_module(f"{sample.package}.activities").add

    def earlier_welcome(ctx, name: str) -> str:  # what an earlier version of welcome did
        return str(ctx.call(add, 1, 2))

    earlier = replace(welcome, fn=earlier_welcome)
    scenario.nondeterministic.append(blocked_workflow(earlier, "bob", from_id, old_workflow))
    return scenario
