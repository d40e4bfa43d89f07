"""Histories you can carry (issue 41, item 2): the export of an execution's whole history
(the REST API, the console's download, ``obelisk_status --export``), and
``workers.testing.replay`` of it against the current code, with the dry run's replay.

- The document: format and version, the execution, every event, every response, the tree's
  summaries; the same from the API, the CLI and the store; JSON all the way.
- Replayed against the same code it is clean; against changed code it is
  ``Nondeterministic`` with the engine's side-by-side message; a history of another
  function, truncated JSON, a truncated or corrupted history are each a clear error.

why: D123
"""

from __future__ import annotations

import dataclasses
import io
import json
from datetime import timedelta

import pytest
from django.core.management import call_command

from executions.store.export import FORMAT, FORMAT_VERSION, export_execution
from tests.support import toolkit_components as c
from tests.support.api import assert_error
from workers.testing import HistoryError, Nondeterministic, replay


@pytest.fixture
def recorded(obelisk_env):
    """A finished ``changes_with`` run: two steps and a 5-minute sleep between them."""
    run = obelisk_env.run(c.changes_with, 1)
    assert run.value == 3
    return run


def _changed(ctx, n: int) -> int:
    """``changes_with`` after a change that breaks its histories: the sleep moved first."""
    ctx.sleep(timedelta(minutes=5))
    first = ctx.call(c.step, n)
    return ctx.call(c.step, first)


def _compatible(ctx, n: int) -> int:
    """A change that keeps the sequence of calls (the arithmetic around them changed)."""
    first = ctx.call(c.step, n)
    ctx.sleep(timedelta(minutes=5))
    return ctx.call(c.step, first) * 1


CHANGED = dataclasses.replace(c.changes_with, fn=_changed)  # the same function name, new code
COMPATIBLE = dataclasses.replace(c.changes_with, fn=_compatible)


def test_the_export_holds_the_execution_its_events_responses_and_children(recorded):
    document = export_execution(recorded.execution_id)
    assert document["format"] == FORMAT and document["format_version"] == FORMAT_VERSION
    execution = document["execution"]
    assert execution["execution_id"] == recorded.execution_id and execution["ffqn"] == c.changes_with.ffqn
    assert execution["result"] == {"ok": 3} and execution["params"] == [1]
    assert [e["version"] for e in document["events"]] == list(range(len(recorded.history())))
    assert len(document["responses"]) == 3  # two children and the delay
    assert sorted(child["ffqn"] for child in document["children"]) == [c.step.ffqn, c.step.ffqn]
    assert json.loads(json.dumps(document)) == document


def test_a_history_replays_cleanly_against_the_code_that_recorded_it(recorded, obelisk_env):
    document = obelisk_env.export(recorded.execution_id)
    verdict = replay(c.changes_with, document)
    assert verdict.clean and verdict.events == len(recorded.history())
    assert replay(COMPATIBLE, json.dumps(document)).clean


def test_a_change_that_breaks_the_history_is_caught_with_the_engines_message(recorded, tmp_path):
    path = tmp_path / "history.json"
    path.write_text(json.dumps(export_execution(recorded.execution_id)))
    with pytest.raises(Nondeterministic) as caught:
        replay(CHANGED, path)
    assert "(differs)" in str(caught.value) and "history" in str(caught.value) and "code" in str(caught.value)
    verdict = replay(CHANGED, path, raise_on_nondeterminism=False)
    assert not verdict.clean and verdict.message == caught.value.detail


def test_a_history_of_another_function_is_refused(recorded):
    document = export_execution(recorded.execution_id)
    with pytest.raises(HistoryError, match=f"is of {c.changes_with.ffqn}, not of {c.sleeps_a_day.ffqn}"):
        replay(c.sleeps_a_day, document)


def test_truncated_json_is_a_clear_error(recorded):
    text = json.dumps(export_execution(recorded.execution_id))
    with pytest.raises(HistoryError, match="not valid JSON .*truncated or corrupted"):
        replay(c.changes_with, text[: len(text) // 2])


def test_a_history_missing_its_last_events_is_a_clear_error(recorded):
    document = export_execution(recorded.execution_id)
    document["events"] = document["events"][:-2]
    with pytest.raises(HistoryError, match="truncated: its last event is version"):
        replay(c.changes_with, document)
    document["events"] = document["events"][1:]
    with pytest.raises(HistoryError, match="does not start with Created"):
        replay(c.changes_with, document)


def test_a_corrupted_event_or_document_is_a_clear_error(recorded):
    document = export_execution(recorded.execution_id)
    document["events"][3]["event"] = {"no_such_event": {}}
    with pytest.raises(HistoryError, match="event 3 of the execution history is corrupted"):
        replay(c.changes_with, document)
    for broken, message in (
        ([], "is a JSON object"),
        ({"format": "something else"}, "not an execution history"),
        ({"format": FORMAT, "format_version": 99}, "format_version 99"),
    ):
        with pytest.raises(HistoryError, match=message):
            replay(c.changes_with, broken)


def test_the_api_exports_the_same_document(recorded, api):
    response = api.get(f"/executions/{recorded.execution_id}/export")
    assert response.status_code == 200, response.content
    assert response.json() == json.loads(json.dumps(export_execution(recorded.execution_id)))
    assert replay(c.changes_with, response.content).clean


def test_the_api_answers_an_unknown_or_malformed_id_in_its_error_shape(obelisk_env, api):
    assert_error(api.get("/executions/E_01KAAAAAAAAAAAAAAAAAAAAAAA/export"), 404, "not_found")
    assert api.get("/executions/nonsense/export").status_code in (400, 422)


def test_obelisk_status_export_prints_the_document_alone(recorded):
    out = io.StringIO()
    call_command("obelisk_status", recorded.execution_id, "--export", stdout=out)
    document = json.loads(out.getvalue())
    assert document == json.loads(json.dumps(export_execution(recorded.execution_id)))
    assert replay(c.changes_with, out.getvalue()).clean


def test_the_console_links_its_download_to_the_export(recorded):
    from executions.console.page.history import export_link

    link = export_link(recorded.execution_id)
    assert link == {
        "url": f"/api/v1/executions/{recorded.execution_id}/export",
        "filename": f"{recorded.execution_id}.history.json",
    }


def test_a_staff_session_downloads_the_export(recorded, client):
    from tests.support.api import make_user

    staff = make_user("grace", "view_executionstate", is_staff=True)
    client.force_login(staff)
    response = client.get(f"/api/v1/executions/{recorded.execution_id}/export")
    assert response.status_code == 200 and response.json()["execution"]["result"] == {"ok": 3}
