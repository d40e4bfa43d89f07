"""The ``NinjaAPI``: routes under ``v1/``, OpenAPI docs at ``docs`` (mounted at ``/api/``).

Authentication with the view permission is the API-wide default (``auth.READ``), so no
route is open by accident; acting routes ask for more, health for nothing. Bodies go
through ``parsing.StrictJsonParser``; every error is re-shaped by ``errors.install``.
"""

from __future__ import annotations

import functools

from django.contrib.auth.views import redirect_to_login
from ninja import NinjaAPI

from executions.schedule_spec import SpecError
from obelisk_api import auth, errors, parsing
from obelisk_api.routes import actions, catalog, deployments, executions, health, schedules

DESCRIPTION = """Submit, inspect, wait for and act on Obelisk executions.

Authenticate with `Authorization: Bearer <token>` (`manage.py obelisk_token create <user>`)
or a Django session (log in at `/admin/`; unsafe methods need the `X-CSRFToken` header).
Reading needs `view_executionstate`; submit, cancel, pause, resume, retry and stub need
`act_on_executions`; so do creating, activating and upgrading a deployment (an upgrade's
dry run only reads), and creating, changing, pausing, resuming, triggering, backfilling and
deleting a schedule. Every error is `{"code", "message"}` with a stable `code`."""


def docs_access(view):
    """The docs and the OpenAPI document: for a logged-in staff user (a browser is sent to
    the admin's login) or any caller with a token allowed to read."""

    @functools.wraps(view)
    def checked(request, *args, **kwargs):
        user = getattr(request, "user", None)
        if user is not None and user.is_active and user.is_staff:
            return view(request, *args, **kwargs)
        try:
            allowed = auth.BearerToken(auth.VIEW_PERMISSION)(request)
        except errors.ApiError as refused:
            return errors.json_error(refused.status, refused.code, refused.message)
        if allowed:
            return view(request, *args, **kwargs)
        return redirect_to_login(request.get_full_path(), "admin:login")

    return checked


api = NinjaAPI(
    title="Obelisk for Django",
    version="1",
    description=DESCRIPTION,
    urls_namespace="obelisk_api",
    docs_url="/docs",
    openapi_url="/openapi.json",
    docs_decorator=docs_access,
    auth=auth.READ,
    parser=parsing.StrictJsonParser(),
)
errors.install(api)
assert actions.router is executions.router  # the acting routes live on the executions router
assert deployments.router is catalog.router  # and deploying on the catalogue's
api.add_router("v1/", executions.router)
api.add_router("v1/", catalog.router)
api.add_router("v1/", schedules.router)
api.add_router("v1/", health.router)


@api.exception_handler(SpecError)
def invalid_schedule(request, exc: SpecError):
    """A schedule's invalid field, also as ``field`` for a client to point at."""
    return api.create_response(request, errors.body(exc.code, exc.message, field=exc.field), status=exc.http_status)
