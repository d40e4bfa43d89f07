import json

from executions import display, store
from executions.events import ExecutionFailure, Finished, TemporarilyFailed, TemporarilyTimedOut
from executions.management.commands._cli import (
    ObeliskCommand,
    check_result,
    parse_seconds,
    result_line,
    status_line,
    tree_lines,
    wait_with_progress,
)
from executions.store.export import export_execution


def last_failure(log) -> tuple[int, str, str | None] | None:
    """``(version, reason, traceback)`` of the latest failed attempt or execution failure."""
    for record in reversed(log.events):
        event = record.event
        if isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
            return record.version, event.retval.reason or event.retval.kind, event.retval.detail
        if isinstance(event, (TemporarilyFailed, TemporarilyTimedOut)):
            return record.version, event.reason, getattr(event, "detail", None)
    return None


class Command(ObeliskCommand):
    help = (
        "Show an execution's state and result; optionally wait for it (the exit status then says "
        "how it finished), or print its history."
    )

    def add_arguments(self, parser):
        parser.add_argument("execution_id")
        parser.add_argument("--wait", action="store_true", help="wait until it finishes")
        parser.add_argument("--timeout", metavar="SECONDS", help="with --wait: give up after this many seconds")
        parser.add_argument("--history", action="store_true", help="print every event and response")
        parser.add_argument("--logs", action="store_true", help="print what its runs logged and printed")
        parser.add_argument("--tree", action="store_true", help="print its child executions with their outcomes")
        parser.add_argument(
            "--export",
            action="store_true",
            help="print its whole history as one JSON document (the API's /export), to replay in tests",
        )

    def handle(self, *args, execution_id, wait, timeout, history, logs, tree, export, **options):
        timeout = parse_seconds(timeout, "--timeout")
        if wait:
            wait_with_progress([execution_id], timeout)
        if export:  # the document alone, so that `> history.json` is a fixture file (D123)
            self.stdout.write(json.dumps(export_execution(execution_id), indent=1, sort_keys=True))
            return
        log = store.get(execution_id)
        self.stdout.write(status_line(log.state))
        self.stdout.write(f"result: {result_line(log.state)}")
        failure = last_failure(log)
        if failure is not None and (options["verbosity"] >= 2 or log.state.is_finished):
            version, reason, detail = failure
            self.stdout.write(f"last failure (version {version}): {reason}")
            if detail and options["verbosity"] >= 2:
                self.stdout.write(detail.rstrip("\n"))
            elif detail:
                self.stdout.write("  (the traceback: add -v 2)")
        if history:
            for line in display.format_history(log):
                self.stdout.write(line)
        if logs:
            for line in display.format_logs(store.list_logs(log.state.execution_id, limit=10_000)):
                self.stdout.write(line)
        if tree:
            for line in tree_lines(log.state.execution_id):
                self.stdout.write(line)
        if wait:
            check_result(log.state.execution_id)
