"""What can be called: the functions of a deployment, with their schemas, and the
deployments themselves (``executions.catalog``)."""

from __future__ import annotations

from ninja import Query, Router

from executions import catalog
from obelisk_api import rendering
from obelisk_api.schemas import (
    DEPLOYMENTS_ERRORS,
    FUNCTIONS_ERRORS,
    READ_ERRORS,
    DeploymentIdText,
    DeploymentOut,
    ErrorOut,
    FunctionOut,
)

router = Router(tags=["catalog"])


@router.get("/functions", response={200: list[FunctionOut], FUNCTIONS_ERRORS: ErrorOut})
def list_functions(
    request, deployment_id: DeploymentIdText | None = Query(None, description="default: the active deployment")
):
    """The submittable functions, each parameter with its JSON Schema and default."""
    return [function.describe() for function in catalog.list_functions(deployment_id)]


@router.get("/deployments", response={200: list[DeploymentOut], DEPLOYMENTS_ERRORS: ErrorOut})
def list_deployments(request, limit: int = Query(100, ge=1, le=1000)):
    """Deployments, newest first."""
    return [rendering.deployment(info) for info in catalog.list_deployments(limit)]


@router.get("/deployments/{deployment_id}", response={200: DeploymentOut, READ_ERRORS: ErrorOut})
def get_deployment(request, deployment_id: DeploymentIdText):
    return rendering.deployment(catalog.get_deployment(deployment_id))
