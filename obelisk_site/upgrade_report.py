"""The console's upgrade dry-run report: a deployment's in-flight executions replayed against
another deployment's code, as a table (issue 38).

A deployment's page (``deployments/admin.py``) sends its "Upgrade dry run" form here with
GET ``?to=<deployment id>``. The replay runs in this process against the code it imports
(``obelisk_api.deploying.dry_run``, the REST API's too, over ``workers.upgrade``): it lives
here, in the site, because the console's packages do not import the runtime. It writes
nothing and offers no "apply": an upgrade is ``obelisk_deploy upgrade`` or the API's. For
staff with ``obelisk_deployments.view_deployment``, behind the admin's login.
why: D111.
"""

from __future__ import annotations

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.urls import reverse

from executions import errors
from executions.ids import parse_deployment_id
from obelisk_api import deploying

TEMPLATE = "obelisk/upgrade_report.html"
PERMISSION = "obelisk_deployments.view_deployment"


def upgrade_report(request, deployment_id: str):
    """GET ``…/<deployment_id>/upgrade-dry-run/?to=<id>``: the dry run's table, or why not."""
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    to_id = request.GET.get("to", "")
    context = {
        **admin.site.each_context(request),
        "title": "Upgrade dry run",
        "is_nav_sidebar_enabled": False,  # the table needs the width
        "from_id": deployment_id,
        "to_id": to_id,
        "from_url": _deployment_url(deployment_id),
        "to_url": _deployment_url(to_id),
        "list_url": reverse("admin:obelisk_deployments_deployment_changelist"),
    }
    try:
        report = deploying.dry_run(deployment_id, to_id)
    except errors.StoreError as error:
        return render(request, TEMPLATE, {**context, "error": error}, status=error.http_status)
    rows = [
        {
            "verdict": verdict,
            "url": reverse("admin:obelisk_executions_executionstate_change", args=[verdict.execution_id]),
        }
        for verdict in report.verdicts
    ]
    context.update(report=report, rows=rows, clean=len(report.clean), nondeterministic=len(report.nondeterministic))
    return render(request, TEMPLATE, context)


def _deployment_url(deployment_id: str) -> str | None:
    """The deployment's page, for a well-formed id (the dry run says if it is unknown)."""
    try:
        parse_deployment_id(deployment_id)
    except errors.InvalidId:
        return None
    return reverse("admin:obelisk_deployments_deployment_change", args=[deployment_id])
