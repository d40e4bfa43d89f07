"""Deployments: immutable, content-addressed roll-outs of components (spec 000 §2.7–§2.12).

These tables are the store's, as every table is: ``executions.store`` writes them, and an
execution records the component digest and deployment that created it
(``t_state.component_id_input_digest`` / ``deployment_id``). They belong to the
``deployments`` app (``app_label`` ``obelisk_deployments``) for the admin, the permissions and the migrations, so
the package ``deployments`` sits above the store and imports it, never the other way.
why: D109.
"""

from django.db import models
from django.db.models import CheckConstraint, Index, Q, UniqueConstraint

from executions.models.base import COMPONENT_TYPES, StoreTable

__all__ = [
    "ComponentMetadata",
    "ComponentSource",
    "DEPLOYMENT_STATUSES",
    "Deployment",
    "DeploymentComponent",
    "DeploymentFile",
    "File",
]

DEPLOYMENT_STATUSES = ["inactive", "enqueued", "active"]


class File(StoreTable):
    """``t_file``: the content-addressed blob store; the key is ``sha256:<hex>`` of the content."""

    digest = models.CharField(primary_key=True, max_length=71)
    content = models.BinaryField()
    size = models.BigIntegerField()

    class Meta:
        app_label = "obelisk_deployments"
        db_table = "t_file"
        constraints = [CheckConstraint(condition=Q(size__gte=0), name="t_file_size_gte_0")]

    def __str__(self) -> str:
        return self.digest


class ComponentMetadata(StoreTable):
    """``t_component_metadata``: what a component exports and imports, keyed by its digest."""

    component_digest = models.CharField(primary_key=True, max_length=71)
    imports_json = models.JSONField(default=list)
    exports_json = models.JSONField(default=list)
    wit = models.TextField(help_text="The component's interface, as text.")
    wit_origin = models.CharField(max_length=32)

    class Meta:
        app_label = "obelisk_deployments"
        db_table = "t_component_metadata"
        verbose_name_plural = "component metadata"

    def __str__(self) -> str:
        return self.component_digest


class ComponentSource(StoreTable):
    """``t_component_source``: maps a backtrace frame's file to the stored source blob."""

    component_digest = models.CharField(max_length=71)
    frame_key = models.TextField()
    is_suffix = models.BooleanField()
    file = models.ForeignKey(File, on_delete=models.PROTECT, db_column="digest")

    class Meta:
        app_label = "obelisk_deployments"
        db_table = "t_component_source"
        constraints = [
            UniqueConstraint(fields=["component_digest", "frame_key", "is_suffix"], name="t_component_source_pk"),
            CheckConstraint(
                condition=Q(is_suffix=False) | Q(frame_key__startswith="/"), name="t_component_source_suffix_slash"
            ),
        ]


class Deployment(StoreTable):
    """``t_deployment``: at most one ``active`` and at most one ``enqueued`` at a time."""

    deployment_id = models.CharField(primary_key=True, max_length=30)
    created_at = models.DateTimeField()
    last_active_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=8, choices=[(s, s) for s in DEPLOYMENT_STATUSES], default="inactive")
    deployment_toml = models.TextField(help_text="The deployment manifest, verbatim.")
    obelisk_version = models.CharField(max_length=64)
    created_by = models.CharField(max_length=256, null=True, blank=True)
    description = models.CharField(max_length=1024, null=True, blank=True)
    digest = models.CharField(max_length=71, help_text="sha256 of the manifest.")

    class Meta:
        app_label = "obelisk_deployments"
        db_table = "t_deployment"
        constraints = [
            CheckConstraint(condition=Q(status__in=DEPLOYMENT_STATUSES), name="t_deployment_status_valid"),
            UniqueConstraint(fields=["status"], condition=Q(status="active"), name="t_deployment_one_active"),
            UniqueConstraint(fields=["status"], condition=Q(status="enqueued"), name="t_deployment_one_enqueued"),
            # Content-addressed: one deployment per manifest.
            UniqueConstraint(fields=["digest"], name="t_deployment_digest"),
        ]
        indexes = [Index(fields=["status"], name="t_deployment_status")]

    def __str__(self) -> str:
        return self.deployment_id


class DeploymentFile(StoreTable):
    """``t_deployment_file``: a file of a deployment; the blob may still be missing from ``t_file``."""

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, db_column="deployment_id", related_name="files"
    )
    digest = models.CharField(max_length=71)
    path = models.TextField()

    class Meta:
        app_label = "obelisk_deployments"
        db_table = "t_deployment_file"
        constraints = [UniqueConstraint(fields=["deployment", "path"], name="t_deployment_file_pk")]
        indexes = [Index(fields=["digest"], name="t_deployment_file_digest")]


class DeploymentComponent(StoreTable):
    """``t_deployment_component``: which component (by digest) a deployment runs under which name."""

    deployment = models.ForeignKey(
        Deployment, on_delete=models.CASCADE, db_column="deployment_id", related_name="components"
    )
    component_name = models.CharField(max_length=256)
    component_type = models.CharField(max_length=16, choices=[(t, t) for t in COMPONENT_TYPES])
    component = models.ForeignKey(ComponentMetadata, on_delete=models.PROTECT, db_column="component_digest")

    class Meta:
        app_label = "obelisk_deployments"
        db_table = "t_deployment_component"
        constraints = [
            UniqueConstraint(fields=["deployment", "component_name"], name="t_deployment_component_pk"),
            CheckConstraint(condition=Q(component_type__in=COMPONENT_TYPES), name="t_deployment_component_type_valid"),
        ]
        indexes = [
            Index(fields=["deployment", "component_type", "component_name"], name="t_deployment_component_type"),
            Index(fields=["deployment", "component"], name="t_deployment_component_digest"),
        ]

    def __str__(self) -> str:
        return f"{self.component_name} ({self.component_type}) {self.component_id}"
