"""Deploying through the API: create a deployment from a manifest, activate one, and move
the in-flight executions of one deployment to another's code, or only see what that would
do (``dry_run=true``). On the catalogue's router (``GET`` and ``POST /deployments`` share
one URL pattern). Creating, activating and upgrading change what runs, so they need
``act_on_executions`` as every acting route does; a dry run writes nothing and needs the
API's default, the view permission. Creating and the dry run import code into this process
(``deploying``); the nondeterministic executions never move (D111).
why: D110, D111.
"""

from __future__ import annotations

from ninja import Query, Status

from executions import catalog, store
from executions.ids import parse_deployment_id
from obelisk_api import deploying, rendering
from obelisk_api.auth import ACT, ACT_PERMISSION, actor, authorize
from obelisk_api.routes.catalog import router
from obelisk_api.schemas import (
    ACTIVATE_ERRORS,
    CREATE_DEPLOYMENT_ERRORS,
    UPGRADE_ERRORS,
    DeploymentIdText,
    DeploymentIn,
    DeploymentOut,
    ErrorOut,
    UpgradeOut,
    UpgradeReportOut,
)

TAGS = ["deployments"]


@router.post(
    "/deployments",
    response={200: DeploymentOut, 201: DeploymentOut, CREATE_DEPLOYMENT_ERRORS: ErrorOut},
    auth=ACT,
    tags=TAGS,
)
def create_deployment(request, body: DeploymentIn):
    """Store the deployment of `manifest` (an `obelisk.toml`) and the code this server
    imports: 201 when new, 200 with the same deployment when it exists (the same manifest
    and code). A manifest that cannot be deployed is 400 `invalid_manifest`, naming the
    file, line and key; nothing is stored then."""
    new = deploying.new_from_manifest(body.manifest, created_by=actor(request))
    deployment_id, created = store.create_deployment(new)
    return Status(201 if created else 200, rendering.deployment(catalog.get_deployment(deployment_id)))


@router.post(
    "/deployments/{deployment_id}/activate",
    response={200: DeploymentOut, ACTIVATE_ERRORS: ErrorOut},
    auth=ACT,
    tags=TAGS,
)
def activate_deployment(request, deployment_id: DeploymentIdText):
    """Make it the active deployment now (the one workers serve unless one is enqueued)."""
    parse_deployment_id(deployment_id)
    store.activate_deployment(deployment_id)
    return rendering.deployment(catalog.get_deployment(deployment_id))


@router.post(
    "/deployments/{deployment_id}/upgrade",
    response={200: UpgradeReportOut | UpgradeOut, UPGRADE_ERRORS: ErrorOut},
    tags=TAGS,
)
def upgrade(
    request,
    deployment_id: DeploymentIdText,
    to: DeploymentIdText = Query(..., description="the deployment whose code the executions move to"),
    dry_run: bool = Query(False, description="only replay and report; write nothing"),
):
    """Replay every in-flight execution pinned to this deployment's components that `to`
    replaces against `to`'s code (this server must import it, else 409
    `deployment_mismatch`). With `dry_run=true`: the report, how many replay cleanly and,
    for each that would not, the message the engine would record. Without: the clean ones
    are moved (needs `act_on_executions`), the nondeterministic ones never are; `refused`
    lists those that changed since their replay. Deployments that share no component are
    400 `no_shared_component`."""
    if not dry_run:
        authorize(request.auth, ACT_PERMISSION)
    from workers import upgrade as upgrading  # the replay: the runtime's

    report = deploying.dry_run(deployment_id, to)
    if dry_run:
        return report.as_json()
    moved, refused = upgrading.apply(report, actor=actor(request), via="api")
    return rendering.upgrade(moved, refused, report.as_json())
