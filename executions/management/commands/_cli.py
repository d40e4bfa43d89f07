"""Shared parsing, output, waiting and exit codes of the ``obelisk_*`` commands.

Every failure of a command is ONE line on stderr, ``CommandError: <code>: <text>``, with
user input rendered by ``errors.excerpt`` (bounded, escaped), and a non-zero exit status;
a refused command writes nothing. The exit statuses are defined here, once.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError
from django.utils import timezone

from executions import display, errors, store
from executions.events import Err, ExecutionFailure, RetVal
from executions.ids import ExecutionId
from executions.store import ExecutionSnapshot

# Exit statuses (also in every command's --help).
EXIT_OK = 0  # done; with --wait: the execution finished with an ok value
EXIT_ERROR = 1  # any other error: bad input, unknown execution, database errors
EXIT_USAGE = 2  # the command line itself is malformed (unknown option, missing argument)
EXIT_ERROR_VALUE = 3  # --wait: the execution finished with an error value ({"err": ...})
EXIT_EXECUTION_FAILURE = 4  # --wait: it finished with an execution failure (timed out, cancelled, ...)
EXIT_WAIT_TIMED_OUT = 5  # --wait --timeout: the wait ended before the execution finished
EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # the reader of stdout went away (`| head`): 128 + SIGPIPE, as `ls | head`

EXIT_CODES_HELP = (
    "Exit status: 0 success (with --wait: finished ok); 1 error (bad input, unknown execution, database); "
    "2 malformed command line; with --wait: 3 finished with an error value, 4 finished with an execution "
    "failure (timed out, cancelled, uncategorized, nondeterminism), 5 the wait timed out; 141 the reader "
    "of the output went away (`| head`). "
    "Errors are one line on stderr: `CommandError: <code>: <message>`."
)

MAX_SECONDS = 100 * 365 * 24 * 3600  # --in and --timeout: at most about 100 years
MESSAGE_CHARS = 500  # bound of a whole error message (store messages may quote input)


def one_line(text: object, limit: int = MESSAGE_CHARS) -> str:
    """``text`` bounded and on one line (newlines and other control characters escaped)."""
    return errors.excerpt(str(text), limit)


def fail(error: errors.StoreError) -> CommandError:
    return CommandError(f"{error.code}: {one_line(error)}", returncode=EXIT_ERROR)


def invalid(message: str) -> CommandError:
    """A refused input (``message`` must already render user input with ``excerpt``)."""
    return CommandError(f"{errors.ValidationFailed.code}: {message}", returncode=EXIT_ERROR)


def parse_seconds(text: str | None, option: str) -> float | None:
    """A command-line duration: a finite number of seconds from 0 to ``MAX_SECONDS``
    (NaN never ends a wait, infinity and 1e300 overflow dates)."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise invalid(f"{option} must be a number of seconds, got `{errors.excerpt(text)}`") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SECONDS:
        raise invalid(
            f"{option} must be a finite number of seconds from 0 to {MAX_SECONDS} (100 years), "
            f"got `{errors.excerpt(text)}`"
        )
    return seconds


class ObeliskCommand(BaseCommand):
    """Base of the ``obelisk_*`` commands: one-line errors and the exit statuses above.

    Store errors become ``<code>: <message>`` (exit 1), database errors ``database_error``
    (exit 1), argparse errors ``usage_error`` (exit 2) — never a traceback (``--traceback``
    still shows one).
    """

    def create_parser(self, prog_name, subcommand, **kwargs):
        kwargs.setdefault("epilog", EXIT_CODES_HELP)
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        _one_line_errors(parser, parser.called_from_command_line)
        return parser

    def execute(self, *args, **options):
        try:
            output = super().execute(*args, **options)
            self.stdout.flush()  # a reader that went away fails here, not at the interpreter's exit
            return output
        except BrokenPipeError:
            _leave_quietly()
        except errors.StoreError as error:
            raise fail(error) from error
        except DatabaseError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise CommandError(f"database_error: {one_line(first)}", returncode=EXIT_ERROR) from error
        except KeyboardInterrupt:
            raise CommandError("interrupted", returncode=EXIT_INTERRUPTED) from None


def _one_line_errors(parser, called_from_command_line: bool) -> None:
    """argparse's errors of ``parser`` and of its subcommands' parsers (``obelisk_token
    create``) as one ``usage_error`` line, exit status 2."""

    def error(message):
        line = f"usage_error: {one_line(message)} (see `{one_line(parser.prog, 100)} --help`)"
        if called_from_command_line:
            # Django parses argv outside its CommandError handler: print and exit here.
            sys.stderr.write(f"CommandError: {line}\n")
            sys.exit(EXIT_USAGE)
        raise CommandError(line, returncode=EXIT_USAGE)

    parser.error = error
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                _one_line_errors(subparser, called_from_command_line)


def _leave_quietly() -> None:
    """The reader of stdout went away (``obelisk_list | head``): what it read was all it
    wanted, so stop at once without a traceback. Stdout then points at /dev/null, so that the
    interpreter's last flush of what is still buffered cannot fail a second time."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    sys.exit(EXIT_BROKEN_PIPE)


def cli_actor() -> str:
    """Who acts from the command line, for the audit trail: ``OBELISK_ACTOR`` if set,
    else the operating-system user."""
    import getpass

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return os.environ.get("OBELISK_ACTOR") or f"os:{user}"


class ExecutionActionCommand(ObeliskCommand):
    """An operator's action on one execution: through ``executions.client``, audited as
    ``cli_actor()`` with ``via="cli"``; ``act`` returns the line to print."""

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def act(self, execution_id: str, actor: str) -> str:
        raise NotImplementedError

    def handle(self, *args, execution_id, **options):
        self.stdout.write(self.act(execution_id, cli_actor()))


def where_it_is(state: ExecutionSnapshot) -> str:
    """The execution's outcome in the console's words (``executions.outcome``: ok, error,
    timed_out, cancelled…, or running, paused, pending…); a scheduled one says when it is due
    (D107)."""
    outcome = state.outcome(timezone.now())
    if outcome == "scheduled":
        return f"scheduled for {state.pending_expires_finished:%Y-%m-%d %H:%M:%S} UTC"
    return outcome


def status_line(state: ExecutionSnapshot) -> str:
    """One line per execution (``obelisk_list``, ``obelisk_status``): id, function, outcome."""
    status = where_it_is(state)
    if state.intermittent_event_count:
        status += f", {state.intermittent_event_count} failed attempt(s)"
    return f"{state.execution_id}  {state.ffqn}  {status}"


def result_line(state: ExecutionSnapshot) -> str:
    """The result, or where an unfinished execution is (never "running" for a paused or
    scheduled one)."""
    retval = store.get_finished_result(state.execution_id)
    return f"none yet: {where_it_is(state)}" if retval is None else display.describe_retval(retval)


def tree_lines(execution_id: str) -> list[str]:
    """An execution and its children, indented by depth: duration, FULL id (to paste into
    ``obelisk_status``), function, outcome (D107)."""
    now = timezone.now()
    lines = []
    for state, retval in store.get_tree(execution_id):
        depth = state.execution_id.count(".")
        if retval is None:
            outcome, took = state.outcome(now), ""
        else:
            outcome = display.describe_retval(retval)
            took = f"{(state.pending_expires_finished - state.created_at).total_seconds() * 1000:8.1f} ms  "
        lines.append(f"{'  ' * (depth + 1)}{took}{state.execution_id}  {state.ffqn}  {outcome}")
    return lines


def check_result(execution_id: str, retval: RetVal | None = None) -> None:
    """After ``--wait``: return for an ok value, else raise the ``CommandError`` whose exit
    status says how the execution finished (3: error value, 4: execution failure)."""
    if retval is None:
        retval = store.get_finished_result(execution_id)
    if isinstance(retval, Err):
        raise CommandError(f"finished_error: {execution_id} finished with an error value", returncode=EXIT_ERROR_VALUE)
    if isinstance(retval, ExecutionFailure):
        raise CommandError(
            f"finished_failure: {execution_id} finished with an execution failure ({retval.kind})",
            returncode=EXIT_EXECUTION_FAILURE,
        )
    if retval is None:  # cannot happen after a successful wait
        raise CommandError(f"not_finished: {execution_id} has not finished", returncode=EXIT_ERROR)


def wait_with_progress(execution_ids: list[str], timeout: float | None, out=sys.stderr) -> None:
    """Wait for the executions to finish, printing their progress every second.

    Raises ``CommandError`` with exit status 5 when ``timeout`` seconds pass first.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = [str(ExecutionId.parse(execution_id)) for execution_id in execution_ids]
    started = time.monotonic()
    while pending:
        step = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
        try:
            store.wait_for_finished(pending, timeout=step)
            pending = []
        except errors.Timeout:
            finished = store.get_finished_results(pending)  # one query for all of them
            pending = [execution_id for execution_id in pending if execution_id not in finished]
            if not pending:
                break
            elapsed = time.monotonic() - started
            if deadline is not None and time.monotonic() >= deadline:
                if _is_terminal(out) and elapsed >= 1.0:
                    out.write("\n")
                raise CommandError(
                    f"timeout: waited {elapsed:.1f} s, {len(pending)} execution(s) still running",
                    returncode=EXIT_WAIT_TIMED_OUT,
                ) from None
            what = (
                status_line(store.get_state(pending[0]))
                if len(pending) == 1
                else f"{len(pending)} of {len(execution_ids)} still running"
            )
            if _is_terminal(out):
                out.write(f"\r  waiting {elapsed:5.1f}s  {what}\033[K")
            else:
                out.write(f"  waiting {elapsed:5.1f}s  {what}\n")
            out.flush()
    if time.monotonic() - started >= 1.0 and _is_terminal(out):
        out.write("\n")


def _is_terminal(out) -> bool:
    stream = getattr(out, "_out", out)  # Django's OutputWrapper
    return hasattr(stream, "isatty") and stream.isatty()
