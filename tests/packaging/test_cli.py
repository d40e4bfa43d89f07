"""The ``obelisk_*`` commands, run as real processes (``python manage.py ...``) on the test
database: every bad input is ONE line on stderr (``CommandError: <code>: <text>``, no
traceback, user input bounded), a non-zero exit status, and no write; ``--wait`` tells how
an execution finished by its exit status (0 ok, 3 error value, 4 execution failure, 5 the
wait timed out).

The commands are other processes, so the tests are transactional (they see only committed
rows). Each process costs about a second of Django start-up: the cases are chosen, not
enumerated. The store-level validation the commands rely on (listing filters, submission)
is also checked in-process, where it is cheap.
"""

from __future__ import annotations

import base64
import os
from datetime import timedelta

import pytest
from django.core.management.base import CommandError
from django.utils import timezone

from executions import errors, store
from executions.events import Err, ExecutionFailure, Finished, Ok
from executions.management.commands import _cli
from tests.support import helpers
from tests.support.processes import MAX_ERROR_LINE, error_line, refused, run
from workers.testing import submit

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "test:acts/basic.add"


@pytest.fixture(autouse=True)
def deployed():
    """The test components' deployment, as a worker registers it at start: the commands
    validate calls against it and import no component code."""
    return helpers.deploy_components()


@pytest.fixture
def pending():
    """A pending execution, so the tables are not empty when a refusal must leave them unchanged."""
    return helpers.create(ADD, [1, 2])


def finished(retval) -> str:
    """An execution finished with ``retval`` by the run holding its lock (fenced)."""
    execution_id = helpers.create(ADD, [1, 2])
    locked = helpers.lock(execution_id)
    store.append(execution_id, locked.next_version, Finished(retval=retval), fence=locked.fence)
    return execution_id


# ---------------------------------------------------------------------------------------
# Bad input: one line, non-zero exit, nothing written (subprocesses)
# ---------------------------------------------------------------------------------------


def test_submit_refuses_a_nul_character_in_the_arguments_without_writing(pending):
    """PostgreSQL text cannot hold U+0000 (a DataError traceback before); SQLite must agree."""
    line = refused("obelisk_submit", ADD, '["a\\u0000b", 1]', code="unsupported_value")
    assert "NUL" in line


def test_submit_refuses_arguments_nested_50000_deep_without_a_recursion_error(pending):
    """``json.loads`` recurses: deep nesting is refused, not a RecursionError traceback."""
    refused("obelisk_submit", ADD, "[" * 50_000 + "]" * 50_000, code="validation_failed")


@pytest.mark.parametrize("value", ["nan", "inf", "1e300", "-1"])
def test_submit_refuses_a_schedule_that_is_not_a_finite_sane_number_of_seconds(pending, value):
    """``--in`` NaN/infinity/1e300 overflowed dates (ValueError/OverflowError); negative made
    no sense. It must be 0 to 100 years."""
    line = refused("obelisk_submit", ADD, "[1, 2]", "--in", value, code="validation_failed")
    assert f"`{value}`" in line


def test_list_refuses_a_function_prefix_that_is_not_valid_unicode(pending):
    """A non-UTF-8 byte in argv becomes a lone surrogate (UnicodeEncodeError in the driver before)."""
    line = refused("obelisk_list", "--function", b"py:\xff", code="unsupported_value")
    assert "\\udcff" in line


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_status_refuses_a_wait_timeout_that_is_not_a_finite_sane_number_of_seconds(pending, value):
    """``--timeout nan`` waited forever (no deadline ever passes); negative and infinite
    timeouts are refused too. ``PROCESS_TIMEOUT`` turns a hang into a failure."""
    refused("obelisk_status", pending, "--wait", "--timeout", value, code="validation_failed")


def test_submit_refuses_an_empty_execution_id_instead_of_generating_one(pending):
    """``--id ''`` used to exit 0 with a generated id: an explicit id must be valid."""
    refused("obelisk_submit", ADD, "[1, 2]", "--id", "", code="invalid_id")


def test_error_messages_quote_a_100_kb_input_as_a_bounded_excerpt(pending):
    """A 100 KB id or function name gives an error line of bounded length that says how
    long the input was."""
    line = refused("obelisk_status", "E_" + "A" * 100_000, code="invalid_id")
    assert "100000 characters" in line
    line = refused("obelisk_submit", "x" * 100_000, code="invalid_id")
    assert "100000 characters" in line


def test_a_malformed_command_line_is_one_usage_line_with_status_2(pending):
    """argparse's own errors (usage text plus message) become one line too."""
    refused("obelisk_submit", ADD, "[1, 2]", "--no-such-option", code="usage_error", status=_cli.EXIT_USAGE)


# ---------------------------------------------------------------------------------------
# --wait: the exit status says how the execution finished (subprocesses)
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retval", "status", "code"),
    [
        (Ok(3), _cli.EXIT_OK, None),
        (Err({"code": "E42"}), _cli.EXIT_ERROR_VALUE, "finished_error"),
        (ExecutionFailure("timed_out", "timed out after 1 s"), _cli.EXIT_EXECUTION_FAILURE, "finished_failure"),
        (ExecutionFailure("cancelled", "cancelled"), _cli.EXIT_EXECUTION_FAILURE, "finished_failure"),
    ],
    ids=["ok", "error-value", "timed-out", "cancelled"],
)
def test_status_wait_exit_status_says_how_the_execution_finished(retval, status, code):
    """Scripts branch on the exit status: 0 ok, 3 an error value, 4 an execution failure;
    the result is still printed on stdout."""
    execution_id = finished(retval)
    result = run("obelisk_status", execution_id, "--wait", "--timeout", "30")
    assert result.returncode == status, result.stderr.decode(errors="replace")
    assert "result: " in result.stdout.decode()
    if code is None:
        assert result.stderr == b""
    else:
        line = error_line(result)
        assert line.startswith(f"CommandError: {code}: {execution_id} "), line


def test_status_wait_that_times_out_exits_5_and_writes_nothing(pending):
    """A wait that ends before the execution finishes is status 5, distinct from failures."""
    refused("obelisk_status", pending, "--wait", "--timeout", "0.5", code="timeout", status=_cli.EXIT_WAIT_TIMED_OUT)


def test_submit_wait_exit_status_says_how_the_execution_finished():
    """``obelisk_submit --wait`` uses the same statuses: resubmitting an execution that
    finished with an error value (idempotent, same id) exits 3 without writing."""
    execution_id, _ = submit(ADD, [1, 2])
    locked = helpers.lock(execution_id)
    store.append(execution_id, locked.next_version, Finished(retval=Err("no")), fence=locked.fence)
    before = helpers.db_snapshot()
    result = run("obelisk_submit", ADD, "[1, 2]", "--id", execution_id, "--wait", "--timeout", "30")
    assert result.returncode == _cli.EXIT_ERROR_VALUE, result.stderr.decode(errors="replace")
    assert error_line(result).startswith(f"CommandError: finished_error: {execution_id} ")
    assert result.stdout.decode().startswith(f"{execution_id} (already existed)\n")
    # The execution tables are as they were; the operator's resubmission is in the audit.
    after = helpers.db_snapshot()
    [audit] = after.pop("AuditEntry")
    before.pop("AuditEntry")
    assert after == before
    assert dict(audit)["action"] == "submit" and dict(audit)["detail"] == {"ffqn": ADD, "created": False}


def test_submit_wait_that_times_out_exits_5_after_submitting():
    """Without a worker the submitted execution stays pending: status 5, its id on stdout."""
    result = run("obelisk_submit", ADD, "[1, 2]", "--wait", "--timeout", "0.5")
    assert result.returncode == _cli.EXIT_WAIT_TIMED_OUT, result.stderr.decode(errors="replace")
    assert error_line(result).startswith("CommandError: timeout: ")
    execution_id = result.stdout.decode().splitlines()[0]
    assert store.get_state(execution_id).state == "pending_at"


def test_status_shows_why_an_execution_failed_and_its_traceback_with_v2():
    """The stored traceback of a failure is where an operator looks: ``obelisk_status``
    prints the reason, and with ``-v 2`` the whole traceback."""
    execution_id, _ = submit(ADD, [1, 2])
    locked = helpers.lock(execution_id)
    trace = (
        'Traceback (most recent call last):\n  File "acts.py", line 3, in add\nZeroDivisionError: division by zero\n'
    )
    failure = ExecutionFailure("uncategorized", "ZeroDivisionError: division by zero", trace)
    store.append(execution_id, locked.next_version, Finished(retval=failure), fence=locked.fence)
    short = run("obelisk_status", execution_id)
    assert short.returncode == 0, short.stderr.decode(errors="replace")
    assert "last failure (version 2): ZeroDivisionError: division by zero" in short.stdout.decode()
    assert 'File "acts.py"' not in short.stdout.decode()
    verbose = run("obelisk_status", execution_id, "-v", "2")
    assert trace.rstrip("\n") in verbose.stdout.decode()


def test_operator_commands_act_through_the_store_audited_as_the_os_user():
    """pause, resume, run_now and retry change the execution by the store's events and
    record who acted (``OBELISK_ACTOR``, else the OS user) with ``via=cli``."""
    later = timezone.now() + timedelta(hours=1)
    execution_id, _ = submit(ADD, [1, 2], scheduled_at=later)
    for command, printed in [
        ("obelisk_pause", "paused"),
        ("obelisk_resume", "resumed"),
        ("obelisk_run_now", "due now"),
    ]:
        result = run(command, execution_id)
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert result.stdout.decode().strip() == f"{execution_id}: {printed}"
    assert helpers.event_variants(execution_id) == ["created", "paused", "unpaused", "rescheduled"]
    locked = helpers.lock(execution_id)
    store.append(execution_id, locked.next_version, Finished(retval=Err("no")), fence=locked.fence)
    retried = run("obelisk_retry", execution_id)
    new_id = retried.stdout.decode().split()[-1]
    assert store.get_created(new_id).metadata["retry_of"] == execution_id
    trail = [(e.action, e.via, e.actor.startswith("os:")) for e in reversed(store.list_audit(execution_id))]
    assert trail == [(a, "cli", True) for a in ("pause", "resume", "run_now", "retry")]
    refused("obelisk_run_now", execution_id, code="already_finished")


@pytest.mark.parametrize("unbuffered", [True, False], ids=["unbuffered", "block-buffered"])
def test_a_reader_that_goes_away_ends_a_command_quietly_with_status_141(pending, unbuffered):
    """``obelisk_list | head -1``: once the reader of the output has gone, the command stops
    with status 141 (128 + SIGPIPE, as ``ls | head``) and nothing on stderr, never a
    ``BrokenPipeError`` traceback, whether its output is written at once or buffered."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    try:
        result = run("obelisk_list", stdout=write_end, unbuffered=unbuffered)
    finally:
        os.close(write_end)
    assert result.stderr.decode() == ""
    assert result.returncode == _cli.EXIT_BROKEN_PIPE == 141


def test_help_lists_the_exit_statuses():
    """The statuses are documented where users look: every command's --help."""
    from executions.management.commands import obelisk_status, obelisk_submit

    for module in (obelisk_status, obelisk_submit):
        text = " ".join(module.Command().create_parser("manage.py", "cmd").format_help().split())
        assert "3 finished with an error value" in text
        assert "5 the wait timed out" in text


# ---------------------------------------------------------------------------------------
# The validation behind the commands (in-process)
# ---------------------------------------------------------------------------------------


def store_refuses(error_type, call):
    """``call()`` raises exactly ``error_type``, with a bounded one-line message, and writes nothing."""
    before = helpers.db_snapshot()
    with pytest.raises(errors.StoreError) as info:
        call()
    assert type(info.value) is error_type, f"{type(info.value).__name__}: {info.value}"
    message = str(info.value)
    assert "\n" not in message and len(message) < MAX_ERROR_LINE, message[:2000]
    assert helpers.db_snapshot() == before
    return info.value


@pytest.mark.parametrize("field", ["ffqn_prefix", "execution_id_prefix"])
def test_listing_refuses_filter_text_the_database_cannot_compare(pending, field):
    """NUL and lone surrogates cannot be sent to PostgreSQL (the driver raised mid-query);
    over-long prefixes cannot match any column: typed errors on both databases."""

    def listing(value):
        return lambda: store.list_executions(store.ExecutionFilter(**{field: value}))

    store_refuses(errors.UnsupportedValue, listing("E_\x00"))
    store_refuses(errors.UnsupportedValue, listing("E_\udcff"))
    store_refuses(errors.ValidationFailed, listing("E_" + "A" * 100_000))


def test_listing_refuses_malformed_cursors_with_a_bounded_message(pending):
    """A cursor is opaque to users, so anything that is not one of ours is ``ValidationFailed``:
    non-ASCII, not base64, NUL in the id, a naive timestamp, 100 KB of junk."""

    def cursor(raw: bytes) -> str:
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    for bad in [
        "\udcff",
        "!!!",
        cursor(b"2030-01-01T00:00:00+00:00|E_\x00"),
        cursor(b"2030-01-01T00:00:00|E_x"),
        cursor(b"no separator"),
        "A" * 100_000,
    ]:
        store_refuses(errors.ValidationFailed, lambda bad=bad: store.list_executions(older_than=bad))
    other = helpers.create(ADD, [3, 4])
    newest = store.list_executions(limit=1)
    # A cursor the store hands out is accepted (an aware timestamp on both databases).
    older = store.list_executions(older_than=newest.older_cursor)
    assert sorted(s.execution_id for s in newest.items + older.items) == sorted([pending, other])


def test_submission_refuses_unstorable_arguments_and_invalid_ids_before_the_store(pending):
    """``workers.testing.submit`` (CLI and API) refuses what cannot be stored, iteratively
    (no RecursionError for deep nesting), and any explicit id that is not a top-level id."""
    deep: list = []
    for _ in range(50_000):
        deep = [deep]
    store_refuses(errors.UnsupportedValue, lambda: submit(ADD, [deep, 1]))
    store_refuses(errors.UnsupportedValue, lambda: submit(ADD, ["a\x00b", 1]))
    store_refuses(errors.UnsupportedValue, lambda: submit(ADD, {"a": "\ud800", "b": 1}))
    store_refuses(errors.UnsupportedValue, lambda: submit(ADD, [float("nan"), 1]))
    store_refuses(errors.InvalidId, lambda: submit(ADD, [1, 2], execution_id=""))
    store_refuses(errors.InvalidId, lambda: submit(ADD, [1, 2], execution_id="E_" + "A" * 100_000))
    child = f"{pending}.n:js_1"
    store_refuses(errors.InvalidId, lambda: submit(ADD, [1, 2], execution_id=child))
    error = store_refuses(errors.ValidationFailed, lambda: submit(ADD, {"x" * 100_000: 1, "a": 1, "b": 2}))
    assert "unknown argument" in str(error)


def test_parse_seconds_accepts_exactly_finite_durations_up_to_100_years():
    """The bound of ``--in`` and ``--timeout``: 0 and 100 years pass, anything else is refused."""
    assert _cli.parse_seconds("0", "--in") == 0
    assert _cli.parse_seconds("0.5", "--in") == 0.5
    assert _cli.parse_seconds(str(_cli.MAX_SECONDS), "--in") == _cli.MAX_SECONDS
    assert _cli.parse_seconds(None, "--in") is None
    assert timedelta(seconds=_cli.MAX_SECONDS) < timedelta(days=365 * 101)
    for bad in ["nan", "-nan", "inf", "-inf", "1e300", "-0.001", str(_cli.MAX_SECONDS + 1), "", "x" * 100_000]:
        with pytest.raises(CommandError) as info:
            _cli.parse_seconds(bad, "--in")
        assert str(info.value).startswith("validation_failed: --in must be"), bad
        assert len(str(info.value)) < MAX_ERROR_LINE


# ---------------------------------------------------------------------------------------
# What the commands print: the outcome, as the console says it (subprocesses)
# ---------------------------------------------------------------------------------------


def test_list_prints_each_executions_outcome_as_the_console_does():
    """A cancelled or timed-out execution was listed as "finished", like one that succeeded:
    the list says ok, error, timed_out, cancelled… (``executions.outcome``), as the badges do."""
    expected = {
        finished(Ok(3)): "ok",
        finished(Err({"code": "E42"})): "error",
        finished(ExecutionFailure("timed_out", "timed out after 1 s")): "timed_out",
        finished(ExecutionFailure("cancelled", "cancelled")): "cancelled",
        helpers.create(ADD, [1, 2]): "pending",
    }
    result = run("obelisk_list")
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    printed = {line.split()[0]: line.split()[2] for line in result.stdout.decode().splitlines()}
    assert printed == expected


def test_status_says_a_paused_or_scheduled_execution_is_paused_or_when_it_is_due():
    """``result: running`` was printed for an execution that was paused, or not due for an
    hour: the result line says where it is instead."""
    due = timezone.now() + timedelta(hours=1)
    scheduled, _ = submit(ADD, [1, 2], scheduled_at=due)
    result = run("obelisk_status", scheduled)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    lines = result.stdout.decode().splitlines()
    assert lines[1] == f"result: none yet: scheduled for {due:%Y-%m-%d %H:%M:%S} UTC", lines
    assert "running" not in result.stdout.decode()
    paused, _ = submit(ADD, [1, 2], paused=True)
    result = run("obelisk_status", paused)
    lines = result.stdout.decode().splitlines()
    assert lines[0] == f"{paused}  {ADD}  paused", lines
    assert lines[1] == "result: none yet: paused", lines


def test_retry_says_which_execution_it_retries_and_the_new_id():
    """``obelisk_retry`` printed a bare id: it says the old id, the function and the new id."""
    old = finished(Err("no"))
    result = run("obelisk_retry", old)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    [line] = result.stdout.decode().splitlines()
    new = line.rsplit(" ", 1)[-1]
    assert line == f"{old}: {ADD} retried as {new}"
    assert store.get_created(new).metadata["retry_of"] == old


# ---------------------------------------------------------------------------------------
# obelisk_token: bad input is one line, never a traceback, and writes nothing
# ---------------------------------------------------------------------------------------


@pytest.fixture
def ada():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.create_user("ada", password="pw")


def token_refused(*argv: str | bytes, code: str, status: int = _cli.EXIT_ERROR) -> str:
    """``obelisk_token`` exits 1 with one bounded ``CommandError: <code>: ...`` line on
    stderr, nothing on stdout, and no token written or revoked."""
    from obelisk_api.models import ApiToken

    before = list(ApiToken.objects.order_by("pk").values())
    result = run("obelisk_token", *argv)
    line = error_line(result)
    assert result.returncode == status, (result.returncode, line)
    assert line.startswith(f"CommandError: {code}: "), line
    assert result.stdout == b""
    assert list(ApiToken.objects.order_by("pk").values()) == before
    return line


@pytest.mark.parametrize(
    ("argv", "code", "quoted"),
    [
        (["create", b"ad\xffa"], "unsupported_value", "\\udcff"),
        (["create", "ada", "--name", b"c\xffi"], "unsupported_value", "\\udcff"),
        (["list", b"\xff"], "unsupported_value", "\\udcff"),
        (["revoke", b"\xff\xfe"], "unsupported_value", "\\udcff"),
        (["create", "ada", "--name", "n" * 201], "validation_failed", "201 characters"),
        (["create", "u" * 100_000], "validation_failed", "100000 characters"),
        (["revoke", "²"], "validation_failed", "²"),
        (["revoke", "9" * 100_000], "validation_failed", "100000 characters"),
        (["revoke", "99999999999999999999"], "validation_failed", "99999999999999999999"),
        (["create", "nobody"], "not_found", "nobody"),
        (["revoke", "zzzzzzzz"], "not_found", "zzzzzzzz"),
    ],
    ids=[
        "invalid-utf8-user",
        "invalid-utf8-name",
        "invalid-utf8-list-user",
        "invalid-utf8-prefix",
        "name-over-200",
        "user-100k",
        "revoke-superscript-two",
        "revoke-100k-digits",
        "revoke-id-beyond-bigint",
        "unknown-user",
        "unknown-prefix",
    ],
)
def test_token_command_refuses_bad_input_with_one_bounded_line(ada, argv, code, quoted):
    """10 of 226 bad command lines gave ``obelisk_token`` tracebacks (UnicodeEncodeError,
    DataError, ValueError from ``int('²')``); it now refuses like every other command."""
    line = token_refused(*argv, code=code)
    assert quoted in line


@pytest.mark.parametrize(
    "argv",
    [["create", "ad\x00a"], ["create", "ada", "--name", "c\x00i"], ["list", "a\x00"], ["revoke", "ab\x00cdefg"]],
    ids=["user", "name", "list-user", "prefix"],
)
def test_token_command_refuses_a_nul_character_with_a_typed_error(ada, argv):
    """argv cannot carry NUL, but ``call_command`` can: PostgreSQL raised an untyped
    ``DataError``; both databases refuse it as ``unsupported_value`` and write nothing."""
    from django.core.management import call_command

    from obelisk_api.models import ApiToken

    with pytest.raises(CommandError) as info:
        call_command("obelisk_token", *argv)
    assert str(info.value).startswith("unsupported_value: "), str(info.value)
    assert "\\x00" in str(info.value)
    assert not ApiToken.objects.exists()


def test_token_command_creates_lists_and_revokes_in_a_process(ada):
    """The good path through the same layer: the token on stdout, the note on stderr."""
    created = run("obelisk_token", "create", "ada", "--name", "ci")
    assert created.returncode == 0, created.stderr.decode(errors="replace")
    token = created.stdout.decode().strip()
    assert len(token) == 43 and "keep it now" in created.stderr.decode()
    listed = run("obelisk_token", "list", "ada")
    assert token[:8] in listed.stdout.decode() and token not in listed.stdout.decode()
    revoked = run("obelisk_token", "revoke", token[:8])
    assert revoked.returncode == 0 and "revoked token" in revoked.stdout.decode()


@pytest.mark.parametrize("argv", [["create"], ["revoke"], ["frobnicate"]], ids=["create", "revoke", "unknown"])
def test_token_command_line_errors_are_one_usage_line_with_status_2(ada, argv):
    """A subcommand's own argparse error (``create`` without a user) printed the usage text
    on two lines: it is one ``usage_error`` line, as for every other command."""
    line = token_refused(*argv, code="usage_error", status=_cli.EXIT_USAGE)
    assert "obelisk_token" in line
