"""Register the code a process runs as a content-addressed deployment.

Until deployments are uploaded and rolled out explicitly, the deployment of a process is
derived from the components it imports: the manifest lists each component (a Python module)
with its digest and exported functions, and the deployment's digest is the manifest's
SHA-256, so every process running the same code finds the same ``Dep_…`` id.
"""

from __future__ import annotations

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
        entry["exports"].append(spec.describe())
    return {"components": sorted(components.values(), key=lambda c: c["name"])}


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
