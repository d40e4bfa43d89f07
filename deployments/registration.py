"""Register the code a process runs as a content-addressed deployment.

Until deployments are uploaded and rolled out explicitly, the deployment of a process is
derived from the components it imports: the manifest lists each component (a Python module)
with its digest and exported functions, and the deployment's digest is the manifest's
SHA-256, so every process running the same code finds the same ``Dep_…`` id.
"""

from __future__ import annotations

import json

from django.db import IntegrityError, transaction
from django.utils import timezone

from deployments.models import ComponentMetadata, Deployment, DeploymentComponent
from executions.ids import content_digest, new_deployment_id

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
    digest = content_digest(toml.encode())
    deployment_id = Deployment.objects.filter(digest=digest).values_list("deployment_id", flat=True).first()
    if deployment_id is None:
        try:
            deployment_id = _insert(manifest, toml, digest)
        except IntegrityError:  # another process registered the same code first
            deployment_id = Deployment.objects.get(digest=digest).deployment_id
    if activate:
        activate_deployment(deployment_id)
    return deployment_id


def _insert(manifest: dict, toml: str, digest: str) -> str:
    now = timezone.now()
    deployment_id = new_deployment_id()
    with transaction.atomic():
        deployment = Deployment.objects.create(
            deployment_id=deployment_id,
            created_at=now,
            status="inactive",
            deployment_toml=toml,
            obelisk_version=OBELISK_VERSION,
            description="registered by a worker from its component modules",
            digest=digest,
        )
        for component in manifest["components"]:
            metadata, _ = ComponentMetadata.objects.get_or_create(
                component_digest=component["digest"],
                defaults={
                    "imports_json": [],
                    "exports_json": component["exports"],
                    "wit": json.dumps(component["exports"], indent=2),
                    "wit_origin": "python",
                },
            )
            DeploymentComponent.objects.create(
                deployment=deployment,
                component_name=component["name"],
                component_type=component["type"],
                component=metadata,
            )
    return deployment_id


def activate_deployment(deployment_id: str) -> None:
    """Make ``deployment_id`` the one active deployment (spec 000 §7.4 activate_deployment)."""
    with transaction.atomic():
        Deployment.objects.filter(status__in=["active", "enqueued"]).exclude(pk=deployment_id).update(status="inactive")
        updated = Deployment.objects.filter(pk=deployment_id).update(status="active", last_active_at=timezone.now())
        if not updated:
            raise Deployment.DoesNotExist(deployment_id)
