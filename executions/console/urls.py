"""The console's addresses of an execution: its page, its actions' confirmation pages, the
download of its history, and the execution id read back from such an address.

Ids are written as they are, not in the admin's ``_5F`` escaping, so an address can be
copied and pasted into ``obelisk_status``; an address in the old escaping (a bookmark)
still reads, since an escaped id never parses as an execution id.

why: D90, D123
"""

from __future__ import annotations

from django.contrib.admin.utils import unquote
from django.urls import NoReverseMatch, reverse

from executions import errors
from executions.ids import ExecutionId

CHANGE_URL = "admin:obelisk_executions_executionstate_change"
ACT_URL = "admin:obelisk_executions_executionstate_act"
EXPORT_URL = "obelisk_api:execution_export"  # the REST API's export (D123), where it is mounted


def execution_url(execution_id: str, **query) -> str:
    """The execution's page; the id in the path as it is, so the address can be copied and
    pasted into ``obelisk_status`` (D90)."""
    url = reverse(CHANGE_URL, args=[execution_id])
    if query:
        url += "?" + "&".join(f"{key}={value}" for key, value in query.items())
    return url


def act_url(execution_id: str, action: str) -> str:
    """The confirmation page of ``action`` on the execution."""
    return reverse(ACT_URL, args=[execution_id, action])


def export_url(execution_id: str) -> str | None:
    """The download of the execution's whole history (the REST API's ``/export``, which
    takes the console's session and asks for the same view permission, D123); None in a
    project that does not mount the API."""
    try:
        return reverse(EXPORT_URL, args=[execution_id])
    except NoReverseMatch:
        return None


def execution_id_of(object_id: str) -> str:
    """The execution id in a console URL: written as it is (D90), or in the admin's
    ``_5F`` escaping of older links and bookmarks. A raw id never needs unescaping (an
    escaped one has ``_5F`` after its ``E``, which no ULID allows)."""
    if store_id_is_valid(object_id):
        return object_id
    return unquote(object_id)


def store_id_is_valid(text: str) -> bool:
    try:
        ExecutionId.parse(text)
    except errors.InvalidId:
        return False
    return True
