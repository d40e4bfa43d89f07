from django.core.management.base import BaseCommand

from executions import display, errors, store
from workers.management.commands._cli import fail, result_line, status_line, wait_with_progress


class Command(BaseCommand):
    help = "Show an execution's state and result; optionally wait for it, or print its history."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")
        parser.add_argument("--wait", action="store_true", help="wait until it finishes")
        parser.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")
        parser.add_argument("--history", action="store_true", help="print every event and response")

    def handle(self, *args, execution_id, wait, timeout, history, **options):
        try:
            if wait:
                wait_with_progress([execution_id], timeout)
            log = store.get(execution_id)
        except errors.StoreError as error:
            raise fail(error) from None
        self.stdout.write(status_line(log.state))
        self.stdout.write(f"result: {result_line(execution_id)}")
        if history:
            for line in display.format_history(log):
                self.stdout.write(line)
