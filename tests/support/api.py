"""What the REST API tests share: users with and without the permissions, their tokens,
HTTP clients that present them, and executions brought to a state through the store.

Requests go through Django's test client to the real URL conf, views and database; the
only thing not exercised is the network socket (bench/api_http.py covers that).
"""

from __future__ import annotations

import json
import re

from django.contrib.auth.models import Permission, User
from django.test import Client

from executions import client as engine
from executions import store
from executions.events import Finished, Ok, RetVal
from executions.models import AuditEntry
from obelisk_api import tokens
from obelisk_api import urls as api_urls
from tests.support import helpers

ADD = "test:acts/basic.add"
NOOP = "test:acts/basic.noop"
VIEW = "view_executionstate"
ACT = "act_on_executions"


def make_user(username: str, *codenames: str, **fields) -> User:
    user = User.objects.create_user(username, password="pw", **fields)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    return user


class Api:
    """A client of ``/api/v1`` presenting ``token`` (or nothing); bodies are JSON."""

    def __init__(self, token: str | None = None, client: Client | None = None):
        self.client = client or Client()
        self.headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token else {}

    def get(self, path: str, params=None, **extra):
        return self.client.get(f"/api/v1{path}", params or {}, **self.headers, **extra)

    def post(self, path: str, body=None, *, raw: bytes | str | None = None, **extra):
        data = raw if raw is not None else (json.dumps(body) if body is not None else "")
        return self.client.post(f"/api/v1{path}", data, content_type="application/json", **self.headers, **extra)

    def request(self, method: str, path: str, **extra):
        return getattr(self.client, method.lower())(path, **self.headers, **extra)

    def submit(self, function: str = ADD, arguments=(1, 2), **fields) -> str:
        response = self.post("/executions", {"function": function, "arguments": list(arguments), **fields})
        assert response.status_code == 201, response.content
        return response.json()["execution_id"]


def api_for(user: User) -> Api:
    return Api(tokens.issue(user.username).token)


def finish(execution_id: str, retval: RetVal = Ok(3)) -> None:
    """Finish an execution as its worker would: lock it, then append ``Finished`` under
    the lock's fence."""
    locked = helpers.lock(execution_id)
    store.append(execution_id, locked.next_version, Finished(retval=retval), fence=locked.fence)


def submitted(function: str = ADD, arguments=(1, 2)) -> str:
    return engine.submit(function, list(arguments)).execution_id


def assert_error(response, status: int, code: str) -> dict:
    """The API's one error shape: JSON ``{"code", "message"}`` with the expected status."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert body["code"] == code, body
    assert isinstance(body["message"], str) and body["message"]
    return body


def everything() -> dict:
    """Every row of the execution tables and the audit trail: equal means nothing written."""
    return {**helpers.db_snapshot(), "audit": list(AuditEntry.objects.order_by("pk").values_list())}


def route_paths() -> list[str]:
    """Every URL pattern of the API's URL conf, path parameters filled in."""
    return list(dict.fromkeys(str(pattern.pattern) for pattern in api_urls._patterns))


def concrete(route: str, values: dict) -> str:
    return "/api/" + re.sub(r"<(?:\w+:)?(\w+)>", lambda m: values[m.group(1)], route)
