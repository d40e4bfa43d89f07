import json
from datetime import timedelta

from django.utils import timezone

from executions import client, errors, store
from executions.management.commands._cli import (
    ObeliskCommand,
    check_result,
    cli_actor,
    invalid,
    parse_seconds,
    result_line,
    wait_with_progress,
)


class Command(ObeliskCommand):
    help = (
        "Submit an execution: a function name and its arguments as JSON (array or object). "
        "With --wait, print the result; the exit status says how it finished."
    )

    def add_arguments(self, parser):
        parser.add_argument("function", help="e.g. py:demo/activities.greet")
        parser.add_argument(
            "arguments", nargs="?", default="[]", help='JSON, e.g. \'["world"]\' or \'{"name": "world"}\''
        )
        parser.add_argument(
            "--id", dest="execution_id", help="execution id (E_<ULID>); submitting the same id twice is idempotent"
        )
        parser.add_argument(
            "--in", dest="delay", metavar="SECONDS", help="schedule it this many seconds from now (0 to 100 years)"
        )
        parser.add_argument("--paused", action="store_true", help="create it paused")
        parser.add_argument("--wait", action="store_true", help="wait for the result and print it")
        parser.add_argument("--timeout", metavar="SECONDS", help="with --wait: give up after this many seconds")

    def handle(self, *args, function, arguments, execution_id, delay, paused, wait, timeout, **options):
        delay = parse_seconds(delay, "--in")
        timeout = parse_seconds(timeout, "--timeout")
        try:
            parsed = json.loads(arguments)
        except RecursionError:
            raise invalid("arguments are nested too deeply to parse") from None
        except ValueError as error:  # JSONDecodeError, or an integer of more than 4300 digits
            raise invalid(f"arguments are not valid JSON: {errors.excerpt(str(error), 200)}") from None
        scheduled_at = timezone.now() + timedelta(seconds=delay) if delay else None
        submitted = client.submit(
            function,
            parsed,
            execution_id=execution_id,
            scheduled_at=scheduled_at,
            paused=paused,
            actor=cli_actor(),
            via="cli",
        )
        execution_id = submitted.execution_id
        note = "" if submitted.created else " (already existed)"
        self.stdout.write(f"{execution_id}{note}")
        if wait:
            wait_with_progress([execution_id], timeout)
            self.stdout.write(result_line(store.get_state(execution_id)))
            check_result(execution_id)
