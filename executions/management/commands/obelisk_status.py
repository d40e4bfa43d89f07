from executions import display, store
from executions.management.commands._cli import (
    ObeliskCommand,
    check_result,
    parse_seconds,
    result_line,
    status_line,
    wait_with_progress,
)


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

    def handle(self, *args, execution_id, wait, timeout, history, logs, tree, **options):
        timeout = parse_seconds(timeout, "--timeout")
        if wait:
            wait_with_progress([execution_id], timeout)
        log = store.get(execution_id)
        self.stdout.write(status_line(log.state))
        self.stdout.write(f"result: {result_line(log.state.execution_id)}")
        if history:
            for line in display.format_history(log):
                self.stdout.write(line)
        if logs:
            for line in display.format_logs(store.list_logs(log.state.execution_id, limit=10_000)):
                self.stdout.write(line)
        if tree:
            for line in display.format_tree(log.state.execution_id):
                self.stdout.write(line)
        if wait:
            check_result(log.state.execution_id)
