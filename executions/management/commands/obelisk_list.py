from executions import store
from executions.management.commands._cli import ObeliskCommand, status_line


class Command(ObeliskCommand):
    help = "List executions, newest first."

    def add_arguments(self, parser):
        parser.add_argument("--status", action="append", default=[], choices=store.STATUS_FILTERS, help="repeatable")
        parser.add_argument("--function", help="function name prefix, e.g. py:demo/")
        parser.add_argument("--derived", action="store_true", help="include child executions")
        parser.add_argument("--limit", type=int, default=20, help="1 to 1000")
        parser.add_argument("--older-than", help="cursor printed at the end of the previous page")

    def handle(self, *args, status, function, derived, limit, older_than, **options):
        filters = store.ExecutionFilter(ffqn_prefix=function, show_derived=derived, statuses=tuple(status))
        page = store.list_executions(filters, limit=limit, older_than=older_than)
        for state in page.items:
            self.stdout.write(status_line(state))
        if not page.items:
            self.stdout.write("no executions")
        if page.older_cursor:
            self.stdout.write(f"more: --older-than {page.older_cursor}")
