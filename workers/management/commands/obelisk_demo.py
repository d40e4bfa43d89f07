"""The README's main job: run sample activities through a real worker cluster."""

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from executions import conf, display, errors, schedules, store
from executions.management.commands._cli import (
    ObeliskCommand,
    parse_seconds,
    status_line,
    tree_lines,
    wait_with_progress,
)
from workers.testing import submit

SAMPLES = [
    ("py:demo/activities.greet", ["world"], "succeeds at once"),
    ("py:demo/activities.flaky", [2], "fails twice, then succeeds (back-off 0.5 s, 1 s)"),
    ("py:demo/activities.slow", [5], "runs past its 1 s timeout: stopped, retried once, finished as timed out"),
    (
        "py:demo/workflows.welcome_team",
        [["Ada", "Grace", "Linus"]],
        "a workflow: fans out 3 activities in a join set, sleeps 1 s on a durable timer, calls a child workflow",
    ),
]


def call_text(ffqn: str, arguments: list) -> str:
    """A call as a person writes it, arguments as JSON: ``py:demo/activities.greet("world")``."""
    return f"{ffqn}({', '.join(json.dumps(argument) for argument in arguments)})"


class Command(ObeliskCommand):
    help = "Start a worker cluster, run the sample activities, print their histories."

    def add_arguments(self, parser):
        parser.add_argument(
            "--timeout", metavar="SECONDS", default="60", help="give up waiting after this many seconds"
        )

    def handle(self, *args, timeout, **options):
        timeout = parse_seconds(timeout, "--timeout")
        modules = conf.get("COMPONENT_MODULES")
        if "demo.activities" not in modules or "demo.workflows" not in modules:
            raise CommandError(
                "configuration_error: the demo needs OBELISK_COMPONENT_MODULES to include demo.activities "
                "and demo.workflows (./scripts/demo.sh sets them; there is no default)"
            )
        self.stdout.write("Starting a worker cluster (2 worker processes)...")
        cluster = subprocess.Popen(
            [sys.executable, "manage.py", "obelisk_worker", "--workers", "2"],
            cwd=settings.BASE_DIR,
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=open(settings.VAR_DIR / "demo-worker.log", "w"),
        )
        try:
            ids = []
            for ffqn, arguments, what in SAMPLES:
                execution_id, _ = submit(ffqn, arguments)
                ids.append(execution_id)
                self.stdout.write(f"  submitted {execution_id}  {call_text(ffqn, arguments)}: {what}")
            self.stdout.write("Waiting for the results...")
            wait_with_progress(ids, timeout, out=self.stdout)
        finally:
            cluster.send_signal(signal.SIGTERM)
            try:
                cluster.wait(20)
            except subprocess.TimeoutExpired:
                cluster.kill()
        for execution_id in ids[:-1]:
            log = store.get(execution_id)
            self.stdout.write("")
            self.stdout.write(status_line(log.state))
            for line in display.format_history(log):
                self.stdout.write(line)
        self.stdout.write(
            "\nThe workflow's tree of executions (child results and timings; any id works with obelisk_status):"
        )
        for line in tree_lines(ids[-1]):
            self.stdout.write(line)
        self._schedule_summary()
        self._console_hint()

    def _schedule_summary(self):
        """The demo's schedule (``@schedule`` on ``demo.activities.tally``): what its worker fired."""
        try:
            row = schedules.get("demo-tally")
        except errors.NotFound:
            return
        fired = [t for t in schedules.ticks("demo-tally", limit=5) if t.execution_id]
        upcoming = schedules.next_fire_times(row, 1)
        self.stdout.write(
            f"\nSchedule demo-tally ({row.ffqn} every {row.interval_seconds:g} s while a worker runs): "
            f"{len(fired)} recent tick(s) started"
            + (f", the last {fired[0].execution_id}" if fired else "")
            + (f"; next at {upcoming[0]:%H:%M:%S} UTC" if upcoming else "")
        )

    def _console_hint(self):
        database = settings.DATABASES["default"]
        if self._is_demo_database(database):
            user_model = get_user_model()
            if not user_model.objects.exists():
                user_model.objects.create_superuser("admin", "admin@localhost", "admin")
                self.stdout.write("\nCreated the operator account admin / admin (in the demo's SQLite file only).")
            login = " (user admin, password admin)"
        else:
            self.stdout.write(
                "\nNo admin/admin account created: it is made only in the demo's own SQLite file, "
                "and DATABASE_URL names another database. Create an operator account with "
                "`python manage.py createsuperuser`."
            )
            login = ""
        var_dir = (
            f" OBELISK_VAR_DIR={shlex.quote(os.environ['OBELISK_VAR_DIR'])}"
            if os.environ.get("OBELISK_VAR_DIR")
            else ""
        )
        self.stdout.write(
            "\nWhere to look: in a shell in this directory, run\n"
            "  . .venv/bin/activate\n"
            f"  export DJANGO_DEBUG=1 OBELISK_COMPONENT_MODULES=demo.activities,demo.workflows,demo.webhooks{var_dir}\n"
            "  python manage.py runserver\n"
            "then open\n"
            f"  http://127.0.0.1:8000/admin/      the operator console{login}: executions, events, worker clusters\n"
            "  http://127.0.0.1:8000/api/docs    the REST API and its OpenAPI documentation\n"
            f"Database: {database['NAME']}\n"
            "CLI (same shell): python manage.py obelisk_list | obelisk_status <id> --history --logs --tree | "
            "obelisk_submit | obelisk_cancel | obelisk_schedule show demo-tally"
        )

    @staticmethod
    def _is_demo_database(database: dict) -> bool:
        """The demo's own SQLite file in var/, and no DATABASE_URL: the only place the demo
        may create its well-known admin/admin account."""
        if os.environ.get("DATABASE_URL"):
            return False
        var_dir = getattr(settings, "VAR_DIR", None)
        if var_dir is None or database["ENGINE"] != "django.db.backends.sqlite3":
            return False
        return Path(database["NAME"]).resolve() == (Path(var_dir) / "obelisk.sqlite3").resolve()
