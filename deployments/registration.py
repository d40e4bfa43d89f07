"""Register the code a process runs as a content-addressed deployment (the zero-configuration path).

Without a deployment made from a manifest (``obelisk_deploy create``, ``workers.components``),
the deployment of a process is derived from the components it imports: the rendered TOML
lists each component (a Python module) with its digest and exported functions, and the
deployment's digest is that text's SHA-256, so every process running the same code finds
the same ``Dep_…`` id. ``describe_function`` is a function's entry in its component's
``exports_json``, the same on both paths (a component digest keys one metadata row).
why: D6, D110.
"""

from __future__ import annotations

from deployments.manifest import format_duration
from executions import store
from executions.ids import content_digest

OBELISK_VERSION = "obelisk-django 0.1"


def manifest_of(functions) -> dict:
    components: dict[str, dict] = {}
    for spec in sorted(functions.values(), key=lambda f: f.ffqn):
        component = spec.component_id
        entry = components.setdefault(
            component.name,
            {
                "name": component.name,
                "type": component.component_type,
                "digest": component.component_digest,
                "exports": [],
            },
        )
        entry["exports"].append(describe_function(spec))
    return {"components": sorted(components.values(), key=lambda c: c["name"])}


def describe_function(spec) -> dict:
    """A registered function's export: its name, parameter and return JSON Schemas
    (``Function.describe``), its kind and the decorator's settings."""
    settings = {
        "max_retries": "forever" if spec.max_retries is None else spec.max_retries,
        "backoff": format_duration(spec.backoff),
        "timeout": format_duration(spec.timeout),
        "lock_duration": format_duration(spec.lock_duration),
    }
    if spec.kind == "workflow":
        settings["blocking"] = spec.blocking
    return {**spec.describe(), "kind": spec.kind, "settings": settings}


def render_manifest(manifest: dict) -> str:
    lines = []
    for component in manifest["components"]:
        lines += [
            "[[component]]",
            f'name = "{component["name"]}"',
            f'type = "{component["type"]}"',
            f'digest = "{component["digest"]}"',
            "exports = [" + ", ".join(f'"{e["ffqn"]}"' for e in component["exports"]) + "]",
            "",
        ]
    return "\n".join(lines)


def ensure_code_deployment(functions, *, activate: bool = False) -> str:
    """The deployment id for these functions, creating its rows the first time."""
    manifest = manifest_of(functions)
    toml = render_manifest(manifest)
    deployment_id = store.register_deployment(
        manifest["components"],
        toml,
        content_digest(toml.encode()),
        obelisk_version=OBELISK_VERSION,
        description="registered by a worker from its component modules",
    )
    if activate:
        store.activate_deployment(deployment_id)
    return deployment_id
