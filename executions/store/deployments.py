"""Deployments: creating, reading, activating, enqueueing and collecting (spec 000 §7.4, §7.5).

A deployment is immutable and keyed by its digest, so creating the same manifest twice
gives the same id, also when two processes race (the unique digest decides; the loser
reads the winner's row). Its source files go into the content-addressed ``t_file``, listed
by ``t_deployment_file``; ``t_component_source`` maps a backtrace frame's file (a path
suffix) to its blob. The current deployment is the enqueued one if any, else the active
one; an enqueued one becomes active when a worker serving it confirms. Each function is
one transaction; this module is the only writer of ``t_deployment*``, ``t_component*`` and
``t_file``. why: D6, D110.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from django.db.models import Q
from django.utils import timezone

from executions import errors
from executions.ids import content_digest, new_deployment_id
from executions.models import (
    ComponentMetadata,
    ComponentSource,
    Deployment,
    DeploymentComponent,
    DeploymentFile,
    File,
)
from executions.store.common import write_transaction

__all__ = [
    "DeploymentRecord",
    "NewDeployment",
    "activate_deployment",
    "confirm_deployment",
    "create_deployment",
    "current_deployment",
    "enqueue_deployment",
    "gc_orphan_files",
    "get_deployment_record",
    "read_file",
    "register_deployment",
    "resolve_source_digest",
]


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


def _insert(
    components: list[dict],
    toml: str,
    digest: str,
    *,
    obelisk_version: str,
    description: str | None,
    created_by: str | None = None,
    extra=None,
) -> str:
    deployment_id = new_deployment_id()
    with write_transaction():
        deployment = Deployment.store_objects.create(
            deployment_id=deployment_id,
            created_at=timezone.now(),
            status="inactive",
            deployment_toml=toml,
            obelisk_version=obelisk_version,
            description=description,
            created_by=created_by,
            digest=digest,
        )
        if extra is not None:
            extra(deployment)
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
            raise errors.NotFound(f"unknown deployment `{errors.excerpt(deployment_id)}`")


@dataclass(frozen=True)
class NewDeployment:
    """What ``create_deployment`` stores. ``components``: ``{"name", "type", "digest",
    "exports"}`` each; ``files``: ``(path, content)`` of every source file, paths relative to
    the import root (``demo/activities.py``); ``sources``: ``(component digest, path)`` for
    the frame mapping (a frame whose file ends with ``/<path>`` shows that file)."""

    toml: str
    digest: str
    obelisk_version: str
    description: str | None = None
    created_by: str | None = None
    components: list[dict] = field(default_factory=list)
    files: list[tuple[str, bytes]] = field(default_factory=list)
    sources: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class DeploymentRecord:
    """A deployment as ``get_deployment_record`` reads it: the row, its components (with
    their exports) and its files (``(path, digest)``)."""

    deployment_id: str
    digest: str
    status: str
    created_at: object
    last_active_at: object
    created_by: str | None
    description: str | None
    toml: str
    components: list[dict]
    files: list[tuple[str, str]]


def create_deployment(new: NewDeployment) -> tuple[str, bool]:
    """``(deployment id, created)``: the deployment of ``new.digest``, created with its files,
    component metadata and frame mapping the first time, in one transaction."""
    found = Deployment.objects.filter(digest=new.digest).values_list("deployment_id", flat=True).first()
    if found is not None:
        return found, False
    try:
        return _insert_new(new), True
    except errors.Conflict:  # another process created the same digest first
        existing = Deployment.objects.filter(digest=new.digest).values_list("deployment_id", flat=True).first()
        if existing is None:
            raise
        return existing, False


def _insert_new(new: NewDeployment) -> str:
    return _insert(
        new.components,
        new.toml,
        new.digest,
        obelisk_version=new.obelisk_version,
        description=new.description,
        created_by=new.created_by,
        extra=lambda deployment: _store_files(deployment, new),
    )


def _store_files(deployment: Deployment, new: NewDeployment) -> None:
    """Blobs (content-addressed, shared), the deployment's file list and the frame mapping."""
    digests = {}
    for path, content in new.files:
        digests[path] = content_digest(content)
    blobs = {digests[path]: content for path, content in new.files}
    File.store_objects.bulk_create(
        [File(digest=d, content=c, size=len(c)) for d, c in sorted(blobs.items())], ignore_conflicts=True
    )
    DeploymentFile.store_objects.bulk_create(
        [DeploymentFile(deployment=deployment, digest=digests[path], path=path) for path in sorted(digests)]
    )
    for component_digest, path in sorted(set(new.sources)):
        ComponentSource.store_objects.update_or_create(
            component_digest=component_digest,
            frame_key="/" + path,
            is_suffix=True,
            defaults={"file_id": digests[path]},
        )


def get_deployment_record(deployment_id: str) -> DeploymentRecord:
    """The deployment ``deployment_id`` with its components and files; ``NotFound`` if none."""
    row = Deployment.objects.filter(pk=deployment_id).first()
    if row is None:
        raise errors.NotFound(f"unknown deployment `{errors.excerpt(deployment_id)}`")
    components = [
        {
            "name": c.component_name,
            "type": c.component_type,
            "digest": c.component_id,
            "exports": c.component.exports_json,
        }
        for c in DeploymentComponent.objects.filter(deployment_id=deployment_id)
        .select_related("component")
        .order_by("component_type", "component_name")
    ]
    files = list(
        DeploymentFile.objects.filter(deployment_id=deployment_id)
        .order_by("path", "digest")
        .values_list("path", "digest")
    )
    return DeploymentRecord(
        row.deployment_id,
        row.digest,
        row.status,
        row.created_at,
        row.last_active_at,
        row.created_by,
        row.description,
        row.deployment_toml,
        components,
        files,
    )


def current_deployment() -> tuple[str, str] | None:
    """``(id, status)`` of the deployment workers serve: the enqueued one if any, else the
    active one (spec 000 §7.4 get_current_deployment); None if neither."""
    rows = Deployment.objects.filter(status__in=["enqueued", "active"]).values_list("deployment_id", "status")
    ranked = sorted(rows, key=lambda row: 0 if row[1] == "enqueued" else 1)
    return ranked[0] if ranked else None


def enqueue_deployment(deployment_id: str) -> str:
    """Make ``deployment_id`` the enqueued deployment (spec 000 §7.4 enqueue_deployment): it
    becomes active when a worker serving it confirms. ``"already_active"`` if it is active,
    else ``"enqueued"``; ``NotFound`` for an unknown id. Another enqueued one is demoted."""
    with write_transaction():
        status = Deployment.store_objects.select_for_update().filter(pk=deployment_id).values_list("status", flat=True)
        status = status.first()
        if status is None:
            raise errors.NotFound(f"unknown deployment `{errors.excerpt(deployment_id)}`")
        Deployment.store_objects.filter(status="enqueued").update(status="inactive")
        if status == "active":
            return "already_active"
        Deployment.store_objects.filter(pk=deployment_id).update(status="enqueued")
        return "enqueued"


def confirm_deployment(deployment_id: str) -> str:
    """A worker serves ``deployment_id``: if it is the enqueued one it becomes active and the
    old active one inactive. Returns the deployment's status afterwards."""
    with write_transaction():
        enqueued = Deployment.store_objects.select_for_update().filter(pk=deployment_id, status="enqueued")
        if enqueued.exists():
            Deployment.store_objects.filter(status="active").update(status="inactive")
            Deployment.store_objects.filter(pk=deployment_id).update(status="active", last_active_at=timezone.now())
        status = Deployment.objects.filter(pk=deployment_id).values_list("status", flat=True).first()
    if status is None:
        raise errors.NotFound(f"unknown deployment `{errors.excerpt(deployment_id)}`")
    return status


def gc_orphan_files() -> int:
    """Delete the blobs no deployment file and no frame mapping references (spec 000 §7.5
    gc_orphan_files); returns how many."""
    with write_transaction():
        referenced = DeploymentFile.objects.values("digest").union(ComponentSource.objects.values("file_id"))
        deleted, _ = File.store_objects.exclude(digest__in=referenced).delete()
    return deleted


def read_file(digest: str) -> bytes | None:
    """A blob of ``t_file`` (spec 000 §7.5 read_blob)."""
    content = File.objects.filter(digest=digest).values_list("content", flat=True).first()
    return None if content is None else bytes(content)


def resolve_source_digest(component_digest: str, file: str) -> str | None:
    """The blob showing a backtrace frame's ``file`` (spec 000 §7.4 resolve_source_digest):
    an exact key, or a suffix key ``file`` ends with; None when none or several match."""
    rows = ComponentSource.objects.filter(component_digest=component_digest).filter(
        Q(is_suffix=False, frame_key=file) | Q(is_suffix=True)
    )
    found = [r.file_id for r in rows if not r.is_suffix or file.endswith(r.frame_key)]
    return found[0] if len(found) == 1 else None
