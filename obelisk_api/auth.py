"""Who may call the API: a bearer token (``obelisk_token``) or a Django session, and with
which permission.

Every route needs a permission, checked as part of authentication: the API's default
(``READ``) is set on the ``NinjaAPI`` itself, so a route added without thinking is closed,
not open; acting routes use ``ACT``; only health opts out (``auth=None``). No credentials
is 401; credentials without the permission is 403.

A session is only as good as its CSRF token for unsafe methods: a page on another site
must not be able to act with an operator's cookie. django-ninja's ``SessionAuth`` checks
CSRF before it knows whether there is a session at all, which would answer an anonymous
POST with 403; here CSRF is checked once a session user is found, so anonymous is 401.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest
from ninja.security import APIKeyCookie, HttpBearer
from ninja.utils import check_csrf

from obelisk_api import tokens
from obelisk_api.errors import ApiError

VIEW_PERMISSION = "obelisk_executions.view_executionstate"
ACT_PERMISSION = "obelisk_executions.act_on_executions"


def authorize(user, permission: str):
    """``user`` if it has ``permission``, else 403 ``forbidden`` (for a route that asks for
    more than its authentication did in some cases)."""
    if not user.has_perm(permission):
        raise ApiError(403, "forbidden", f"user `{user.get_username()}` lacks the permission `{permission}`")
    return user


class BearerToken(HttpBearer):
    """``Authorization: Bearer <token>``, a token issued by ``manage.py obelisk_token``."""

    def __init__(self, permission: str):
        self.permission = permission
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str):
        user = tokens.user_of(token)
        return None if user is None else authorize(user, self.permission)


class Session(APIKeyCookie):
    """The Django session of a logged-in user (the browsable docs), CSRF-checked for
    unsafe methods."""

    param_name = settings.SESSION_COOKIE_NAME

    def __init__(self, permission: str):
        self.permission = permission
        super().__init__(csrf=True)

    def _get_key(self, request: HttpRequest):
        return request.COOKIES.get(self.param_name)

    def authenticate(self, request: HttpRequest, key):
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if not getattr(request, "_ninja_csrf_exempt", False) and check_csrf(request) is not None:
            raise ApiError(403, "csrf_failed", "CSRF check failed: send the X-CSRFToken header with the session")
        return authorize(user, self.permission)


def requires(permission: str) -> list:
    return [BearerToken(permission), Session(permission)]


READ = requires(VIEW_PERMISSION)
ACT = requires(ACT_PERMISSION)


def actor(request: HttpRequest) -> str:
    """The name recorded in the audit trail for an action."""
    return request.auth.get_username()
