"""The components a worker serves: a deployment's, or the modules of ``OBELISK['COMPONENT_MODULES']``.

Importing a module runs its decorators (``workers/activity.py``, ``workers/workflow.py``),
which fill the registry (``workers/registry.py``); this module is the runtime's side of
that. With a deployment made from a manifest (``obelisk_deploy create``), a worker serves
the current one (enqueued, else active) or ``--deployment ID``: it imports the manifest's
components, refuses to start when their digests differ from the deployment's, and applies
the manifest's settings. Without one, the imported modules form the deployment (D6). The
building of a deployment from a manifest is here too (it imports the user's code).
The authoring API itself reads no settings. why: D6, D110.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from dataclasses import dataclass
from datetime import timedelta

from deployments.digests import SourceFile, digest_of_files, import_root, origin_of_module, source_files
from deployments.manifest import ComponentEntry, Manifest, ManifestError, deployment_digest, is_manifest_text
from deployments.manifest import parse_manifest as parse_manifest_text
from deployments.registration import OBELISK_VERSION, describe_function, ensure_code_deployment
from executions import conf, schedules, store
from executions.events import ComponentId
from executions.schedules import ScheduleRequest
from workers.registry import Function, RegistrationError, registered
from workers.scheduling import declared_schedules

SERVED_DEPLOYMENT_VARIABLE = "OBELISK_SERVED_DEPLOYMENT"  # set by obelisk_worker for its processes


def load_components(modules: list[str] | None = None) -> dict[str, Function]:
    """Import the component modules (``OBELISK['COMPONENT_MODULES']``) and return the registry."""
    if modules is None:
        modules = conf.get("COMPONENT_MODULES")
    for module in modules:
        if module and module.strip():
            _import_component(module.strip())
    return registered()


def _import_component(module: str) -> None:
    """Import one component module; one that does not exist is a ``RegistrationError`` that
    names it and the setting (a typo there is the usual cause), not a traceback. An import
    error *inside* an existing module is the module's own bug: its traceback is kept."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = error.name or ""
        if not missing or not (module == missing or module.startswith(missing + ".")):
            raise
        raise RegistrationError(
            f"component module `{module}` does not exist (no module named `{missing}`): fix "
            "OBELISK_COMPONENT_MODULES (OBELISK['COMPONENT_MODULES']), a comma-separated list of "
            "modules importable from the project, such as `myapp.activities,myapp.workflows`"
        ) from None


class DeploymentMismatch(RegistrationError):
    """The imported code is not the deployment's: a worker refuses to start."""


@dataclass(frozen=True)
class LoadedComponent:
    """A component of a manifest, imported: its name (``module`` or ``module:workflow``),
    kind, digest, functions and source files (paths relative to the import root)."""

    entry: ComponentEntry
    name: str
    kind: str
    digest: str
    functions: tuple[Function, ...]
    files: tuple[tuple[str, SourceFile], ...]


def import_manifest(manifest: Manifest) -> list[LoadedComponent]:
    """Import every component of ``manifest`` and check its function settings; each
    mistake is a ``ManifestError`` naming the file, line and key."""
    loaded, owner = [], {}
    for entry in manifest.components:
        functions = _import_entry(manifest, entry, owner)
        _check_function_settings(manifest, entry, functions)
        origin = origin_of_module(entry.module)
        root = import_root(entry.module)
        files = tuple((f.location.relative_to(root).as_posix(), f) for f in source_files(origin))
        for kind in ("activity", "workflow"):
            of_kind = tuple(f for f in functions if f.kind == kind)
            if of_kind:
                name = entry.module if kind == "activity" else f"{entry.module}:{kind}"
                digest = digest_of_files(kind, [f for _, f in files])
                loaded.append(LoadedComponent(entry, name, kind, digest, of_kind, files))
    return loaded


def _import_entry(manifest: Manifest, entry: ComponentEntry, owner: dict[str, str]) -> list[Function]:
    """Import the entry's module (and a package's submodules); its functions, by name.
    ``owner`` (function name → module) catches a name two components export."""
    before = registered()
    names = [entry.module]
    _import_for_manifest(manifest, entry, entry.module)
    package = importlib.import_module(entry.module)
    if getattr(package, "__path__", None) is not None:
        for info in pkgutil.walk_packages(package.__path__, prefix=entry.module + "."):
            names.append(info.name)
            _import_for_manifest(manifest, entry, info.name)
    functions = []
    for ffqn, spec in sorted(registered().items()):
        if spec.module not in names:  # another component's, imported by this one's code
            continue
        replaced = ffqn in before and before[ffqn].module != spec.module
        if replaced or (ffqn in owner and owner[ffqn] != entry.module):
            raise manifest.error(
                f"duplicate function name `{ffqn}`: exported by `{before[ffqn].module if replaced else owner[ffqn]}` "
                f"and `{spec.module}`",
                component=entry,
                key="module",
            )
        owner[ffqn] = entry.module
        functions.append(spec)
    if not functions:
        raise manifest.error(f"`{entry.module}` exports no @activity or @workflow", component=entry, key="module")
    return functions


def _import_for_manifest(manifest: Manifest, entry: ComponentEntry, module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and (module == error.name or module.startswith(error.name + ".")):
            raise manifest.error(
                f"unknown module: no module named `{error.name}`", component=entry, key="module"
            ) from None
        raise manifest.error(f"`{module}` fails to import: {error}", component=entry, key="module") from None
    except RegistrationError as error:
        where = f" ({error.where})" if error.where else ""
        raise manifest.error(f"`{module}` fails to import: {error}{where}", component=entry, key="module") from None
    except Exception as error:  # the module's own bug, named, not a traceback
        raise manifest.error(
            f"`{module}` fails to import: {type(error).__name__}: {error}", component=entry, key="module"
        ) from None


def _check_function_settings(manifest: Manifest, entry: ComponentEntry, functions: list[Function]) -> None:
    by_name = {f.ffqn: f for f in functions}
    for ffqn, settings in entry.functions.items():
        if ffqn not in by_name:
            exported = ", ".join(sorted(by_name))
            raise manifest.error(
                f"unknown function; `{entry.module}` exports: {exported}", component=entry, function=ffqn
            )
        if "blocking" in settings and by_name[ffqn].kind != "workflow":
            raise manifest.error("blocking applies to workflows only", component=entry, function=ffqn, key="blocking")
    if "blocking" in entry.settings and not any(f.kind == "workflow" for f in functions):
        raise manifest.error(
            f"blocking applies to workflows only, and `{entry.module}` has none", component=entry, key="blocking"
        )


def new_deployment(manifest: Manifest, *, created_by: str | None = None) -> store.NewDeployment:
    """The deployment of ``manifest`` and the code this process imports, ready to store."""
    loaded = import_manifest(manifest)
    files = {path: source.read() for component in loaded for path, source in component.files}
    return store.NewDeployment(
        toml=manifest.text,
        digest=deployment_digest(manifest, {c.name: c.digest for c in loaded}),
        obelisk_version=OBELISK_VERSION,
        description=manifest.description,
        created_by=created_by,
        components=[
            {"name": c.name, "type": c.kind, "digest": c.digest, "exports": [describe_function(f) for f in c.functions]}
            for c in loaded
        ],
        files=sorted(files.items()),
        sources=sorted({(c.digest, path) for c in loaded for path, _ in c.files}),
    )


def load_deployment(deployment_id: str) -> dict[str, Function]:
    """Import the deployment's components, check that they are its code, and return its
    functions with the manifest's settings applied. ``DeploymentMismatch`` names the
    component and both digests; a component that no longer imports is one too."""
    record = store.get_deployment_record(deployment_id)
    if not is_manifest_text(record.toml):
        return _load_code_deployment(record)
    manifest = parse_manifest_text(record.toml, f"deployment {deployment_id}")
    try:
        loaded = import_manifest(manifest)
    except ManifestError as error:
        raise DeploymentMismatch(f"cannot serve deployment {deployment_id}: {error}") from None
    _compare(deployment_id, record, {c.name: c.digest for c in loaded})
    functions = {}
    for component in loaded:
        identity = ComponentId(component_type=component.kind, name=component.name, component_digest=component.digest)
        for spec in component.functions:
            _apply(spec, manifest.settings_of(component.entry.module, spec.ffqn), identity)
            functions[spec.ffqn] = spec
    return functions


def _load_code_deployment(record: store.DeploymentRecord) -> dict[str, Function]:
    """A deployment a worker registered from its modules: this process's modules must be it."""
    functions = load_components()
    _compare(
        record.deployment_id, record, {f.component_id.name: f.component_id.component_digest for f in functions.values()}
    )
    return functions


def _compare(deployment_id: str, record: store.DeploymentRecord, imported: dict[str, str]) -> None:
    expected = {c["name"]: c["digest"] for c in record.components}
    for name in sorted(set(expected) | set(imported)):
        if expected.get(name) != imported.get(name):
            raise DeploymentMismatch(
                f"the code here is not deployment {deployment_id}: component `{name}` is "
                f"{expected.get(name) or 'not in the deployment'} there but "
                f"{imported.get(name) or 'not imported'} here; check out the deployment's code, "
                "or create a deployment of this code (obelisk_deploy create)"
            )


def _apply(spec: Function, settings: dict, identity: ComponentId) -> None:
    """The manifest's settings over the decorator's, and the component the function runs in."""
    for key, value in settings.items():
        if key in ("backoff", "timeout", "lock_duration"):
            value = timedelta(milliseconds=value)
        setattr(spec, key, value)
    spec._component = identity  # registry.Function has no public setter yet (T4 report)


def serve(deployment_id: str | None = None) -> tuple[str, dict[str, Function]]:
    """What a worker cluster serves: ``deployment_id``; else the current deployment when it
    was made from a manifest (an enqueued one is confirmed: it becomes active); else the
    imported modules (``COMPONENT_MODULES``) as their own deployment, activated."""
    if deployment_id is None:
        current = store.current_deployment()
        if current is not None and is_manifest_text(store.get_deployment_record(current[0]).toml):
            deployment_id = current[0]
    if deployment_id is None:
        functions = load_components()
        deployment_id = ensure_code_deployment(functions, activate=True)
    else:
        functions = load_deployment(deployment_id)
        store.confirm_deployment(deployment_id)
    apply_declared_schedules(functions)
    return deployment_id, functions


def apply_declared_schedules(functions: dict[str, Function]) -> dict[str, str]:
    """Apply the ``@schedule`` declarations of the served functions (after their
    deployment is registered, so their targets are checked against it). Idempotent: by
    schedule id. Declarations of other code this process happened to import are not this
    worker's to apply."""
    requests = [
        ScheduleRequest(**{k: v for k, v in vars(declared).items() if k != "where"}, source="code")
        for declared in declared_schedules()
        if declared.ffqn in functions
    ]
    return schedules.apply(requests)


def served_by_this_process() -> tuple[str, dict[str, Function]]:
    """What a worker process of a cluster serves: the deployment its cluster chose
    (``OBELISK_SERVED_DEPLOYMENT``), else the imported modules' deployment."""
    deployment_id = os.environ.get(SERVED_DEPLOYMENT_VARIABLE)
    if deployment_id:
        return deployment_id, load_deployment(deployment_id)
    functions = load_components()
    return ensure_code_deployment(functions), functions
