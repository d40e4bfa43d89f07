"""The console's "Webhook calls" list and the execution page's "started by webhook call"
section (``executions/console/webhook_calls.py``, ``executions/console/page/webhook.py``)."""

from __future__ import annotations

import pytest

from executions.console.page.webhook import webhook_calls
from tests.support import helpers
from tests.support.api import VIEW, make_user
from tests.support.webhooks import SECRETS, as_meta, github_headers, payload

pytestmark = pytest.mark.django_db

LIST_URL = "/admin/obelisk_executions/webhookcall/"


@pytest.fixture(autouse=True)
def deployed(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return helpers.deploy_components(("tests.support.components", "tests.support.webhook_components"))


def deliver(client, delivery: str):
    body = payload("console")
    return client.post(
        "/hooks/github", body, content_type="application/json", **as_meta(github_headers(body, delivery))
    )


def test_the_webhook_calls_list_shows_each_call_with_its_status_execution_and_key(client):
    first = deliver(client, "console-1")
    refused = client.post("/hooks/open", b"{bad", content_type="application/json")
    viewer = make_user("viewer", VIEW, is_staff=True)
    client.force_login(viewer)
    page = client.get(LIST_URL)
    assert page.status_code == 200
    html = page.content.decode()
    execution_id = first.json()["execution_id"]
    assert first["X-Obelisk-Request-Id"] in html and refused["X-Obelisk-Request-Id"] in html
    assert f"/admin/obelisk_executions/executionstate/{execution_id}/change/" in html
    assert "console-1" in html and "POST /github" in html and "obelisk-http-400" in html
    filtered = client.get(LIST_URL, {"status_class": "4xx"}).content.decode()
    assert refused["X-Obelisk-Request-Id"] in filtered and first["X-Obelisk-Request-Id"] not in filtered
    assert client.get(LIST_URL + "add/").status_code == 403  # read-only


def test_the_execution_page_section_names_the_call_that_started_it_first(client):
    first = deliver(client, "console-2")
    again = deliver(client, "console-2")
    section = webhook_calls(first.json()["execution_id"])
    assert section["started_by_webhook"]["call_id"] == first["X-Obelisk-Request-Id"]
    assert [c["call_id"] for c in section["webhook_calls"]] == [
        first["X-Obelisk-Request-Id"],
        again["X-Obelisk-Request-Id"],
    ]
    assert section["started_by_webhook"]["url"].endswith("?q=" + first["X-Obelisk-Request-Id"])
    assert webhook_calls(helpers.create())["started_by_webhook"] is None
