"""Deployments: registering a content-addressed deployment and activating one (spec 000 §7.4).

A deployment is immutable and keyed by its digest, so registering the same manifest twice
gives the same id, also when two processes race (the unique digest decides; the loser
reads the winner's row). Each function is one transaction.
"""

from __future__ import annotations

import json

from django.utils import timezone

from executions import errors
from executions.ids import new_deployment_id
from executions.models import ComponentMetadata, Deployment, DeploymentComponent
from executions.store.common import write_transaction

__all__ = ["activate_deployment", "register_deployment"]


def register_deployment(
    components: list[dict], toml: str, digest: str, *, obelisk_version: str, description: str
) -> str:
    """The id of the deployment of this digest, creating it and its components the first time.

    ``components``: ``{"name", "type", "digest", "exports"}`` each (``exports`` as stored in
    ``t_component_metadata.exports_json``)."""
    found = Deployment.objects.filter(digest=digest).values_list("deployment_id", flat=True).first()
    if found is not None:
        return found
    try:
        return _insert(components, toml, digest, obelisk_version=obelisk_version, description=description)
    except errors.Conflict:  # another process registered the same digest first
        return Deployment.objects.get(digest=digest).deployment_id


def _insert(components: list[dict], toml: str, digest: str, *, obelisk_version: str, description: str) -> str:
    deployment_id = new_deployment_id()
    with write_transaction():
        deployment = Deployment.store_objects.create(
            deployment_id=deployment_id,
            created_at=timezone.now(),
            status="inactive",
            deployment_toml=toml,
            obelisk_version=obelisk_version,
            description=description,
            digest=digest,
        )
        for component in components:
            metadata, _ = ComponentMetadata.store_objects.get_or_create(
                component_digest=component["digest"],
                defaults={
                    "imports_json": [],
                    "exports_json": component["exports"],
                    "wit": json.dumps(component["exports"], indent=2),
                    "wit_origin": "python",
                },
            )
            DeploymentComponent.store_objects.create(
                deployment=deployment,
                component_name=component["name"],
                component_type=component["type"],
                component=metadata,
            )
    return deployment_id


def activate_deployment(deployment_id: str) -> None:
    """Make ``deployment_id`` the one active deployment (spec 000 §7.4 activate_deployment)."""
    with write_transaction():
        Deployment.store_objects.filter(status__in=["active", "enqueued"]).exclude(pk=deployment_id).update(
            status="inactive"
        )
        updated = Deployment.store_objects.filter(pk=deployment_id).update(
            status="active", last_active_at=timezone.now()
        )
        if not updated:
            raise Deployment.DoesNotExist(deployment_id)
