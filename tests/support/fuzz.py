"""What the API fuzz tests (``tests/api/test_api_fuzz.py``) share: the engine's row counts,
the Django WSGI application to call in-process, the operator's token, and the Hypothesis
strategies for JSON values and hostile text.

Everything runs inside the test's database transaction, on the test's own connection:
the WSGI application is Django's real handler (middleware, URL conf, views), minus the
socket.
"""

from __future__ import annotations

import contextlib
import json
import string

from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from hypothesis import strategies as st

from tests.support.api import everything

# Every table of the engine must be counted; a missing one means the list (or the schema)
# drifted and the "nothing written" property would silently cover less.
ENGINE_TABLES = {
    "t_state",
    "t_execution_log",
    "t_join_set_response",
    "t_delay",
    "t_log",
    "t_audit",
    "t_backtrace",
    "t_execution_backtrace",
    "t_cluster",
    "t_file",
    "t_component_metadata",
    "t_component_source",
    "t_deployment",
    "t_deployment_file",
    "t_deployment_component",
    "t_api_token",
}


def engine_tables() -> list[str]:
    """Every ``t_*`` table in the database (the engine's, the deployments', the tokens')."""
    found = sorted(name for name in connection.introspection.table_names() if name.startswith("t_"))
    missing = ENGINE_TABLES - set(found)
    assert not missing, f"engine tables not in the database: {sorted(missing)}"
    return found


def row_counts() -> dict[str, int]:
    """Row count of every engine table. ``t_api_token`` is counted only: a call updates its
    token's ``last_used_at``, which is not a write the properties forbid."""
    counts = {}
    with connection.cursor() as cursor:
        for table in engine_tables():
            cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
            counts[table] = cursor.fetchone()[0]
    return counts


def database_state() -> tuple[dict[str, int], dict]:
    """Row counts of every engine table and every row of the execution tables and the audit
    trail: equal before and after a call means the call wrote nothing (no insert, no update
    of an execution, no audit entry)."""
    return row_counts(), everything()


def describe_difference(before: tuple[dict, dict], after: tuple[dict, dict]) -> str:
    counts = {t: (before[0][t], after[0].get(t)) for t in before[0] if before[0][t] != after[0].get(t)}
    rows = [name for name in before[1] if before[1][name] != after[1].get(name)]
    return f"row counts changed {counts}; rows changed in {rows}"


@contextlib.contextmanager
def in_process_wsgi():
    """Django's ``WSGIHandler``, kept from closing the test's connection.

    The handler closes "old" connections when a request starts and finishes; inside the
    test's transaction that would close the connection holding it (Django's test client
    disconnects the same receivers for the same reason).
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def error_body(content: bytes) -> dict:
    """The API's error shape, or an assertion saying what came instead."""
    try:
        body = json.loads(content)
    except ValueError:
        raise AssertionError(f"a 4xx body is not JSON: {content[:300]!r}") from None
    assert isinstance(body, dict), body
    assert isinstance(body.get("code"), str) and body["code"], body
    assert isinstance(body.get("message"), str) and body["message"], body
    return body


# ---------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------

# Any Unicode text Python can hold except lone surrogates (a str with one cannot be UTF-8
# encoded, so it cannot be sent as such; raw bodies carry them as "\ud800" escapes).
any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)
hostile_text = st.one_of(
    any_text,
    st.text(
        st.sampled_from(["\x00", "\ufeff", "\u202e", "é", "\U0001f600", "'", '"', "\\", "%", "_", "\n"]), max_size=8
    ),
    st.just(""),
)
# Text that a database stores as it is: no NUL (PostgreSQL text cannot hold U+0000).
storable_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40)

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    any_text,
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(any_text, children, max_size=5),
    ),
    max_leaves=20,
)

# Well-formed top-level ids (``E_<ULID>``), drawn by Hypothesis so runs are reproducible.
CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
valid_execution_ids = st.builds(
    lambda first, rest: f"E_{first}{rest}",
    st.sampled_from("01234567"),
    st.text(st.sampled_from(CROCKFORD), min_size=25, max_size=25),
)
execution_ids = st.one_of(
    valid_execution_ids,
    hostile_text,
    st.builds(lambda ulid: ulid.lower(), valid_execution_ids),
    st.builds(lambda ulid, tail: ulid + tail, valid_execution_ids, st.sampled_from([".n:js_1", "\x00", " ", "x"])),
)
function_names = st.one_of(
    st.sampled_from(["test:acts/basic.add", "test:acts/basic.greet", "test:acts/basic.noop", "test:acts/basic.nope"]),
    hostile_text,
    st.builds(lambda a, b: f"{a}:{b}/x.y", hostile_text, hostile_text),
)
ascii_words = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=12)
