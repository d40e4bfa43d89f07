import json
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from executions import errors
from workers.management.commands._cli import fail, result_line, wait_with_progress
from workers.submission import submit


class Command(BaseCommand):
    help = "Submit an execution: a function name and its arguments as JSON (array or object)."

    def add_arguments(self, parser):
        parser.add_argument("function", help="e.g. py:demo/activities.greet")
        parser.add_argument(
            "arguments", nargs="?", default="[]", help='JSON, e.g. \'["world"]\' or \'{"name": "world"}\''
        )
        parser.add_argument(
            "--id", dest="execution_id", help="execution id (E_<ULID>); submitting the same id twice is idempotent"
        )
        parser.add_argument("--in", dest="delay", type=float, help="schedule it this many seconds from now")
        parser.add_argument("--paused", action="store_true", help="create it paused")
        parser.add_argument("--wait", action="store_true", help="wait for the result and print it")
        parser.add_argument("--timeout", type=float, default=None, help="with --wait: give up after this many seconds")

    def handle(self, *args, function, arguments, execution_id, delay, paused, wait, timeout, **options):
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as error:
            raise CommandError(f"arguments are not valid JSON: {error}") from None
        scheduled_at = timezone.now() + timedelta(seconds=delay) if delay else None
        try:
            execution_id, outcome = submit(
                function, parsed, execution_id=execution_id, scheduled_at=scheduled_at, paused=paused
            )
        except errors.StoreError as error:
            raise fail(error) from None
        note = " (already existed)" if outcome.already_existed else ""
        self.stdout.write(f"{execution_id}{note}")
        if wait:
            wait_with_progress([execution_id], timeout)
            self.stdout.write(result_line(execution_id))
