"""The README's main job: run sample activities through a real worker cluster."""

import os
import signal
import subprocess
import sys

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from executions import display, store
from executions.management.commands._cli import ObeliskCommand, parse_seconds, status_line, wait_with_progress
from workers.submission import submit

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


class Command(ObeliskCommand):
    help = "Start a worker cluster, run the sample activities, print their histories."

    def add_arguments(self, parser):
        parser.add_argument(
            "--timeout", metavar="SECONDS", default="60", help="give up waiting after this many seconds"
        )

    def handle(self, *args, timeout, **options):
        timeout = parse_seconds(timeout, "--timeout")
        modules = settings.OBELISK.get("COMPONENT_MODULES", [])
        if "demo.activities" not in modules or "demo.workflows" not in modules:
            raise CommandError(
                "configuration_error: the demo needs OBELISK_COMPONENT_MODULES to include demo.activities "
                "and demo.workflows"
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
                self.stdout.write(f"  submitted {execution_id}  {ffqn}{tuple(arguments)}: {what}")
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
        self.stdout.write("\nThe workflow's tree of executions (child results and timings):")
        for line in display.format_tree(ids[-1]):
            self.stdout.write(line)
        self._console_hint()

    def _console_hint(self):
        user_model = get_user_model()
        if not user_model.objects.exists():
            user_model.objects.create_superuser("admin", "admin@localhost", "admin")
            self.stdout.write("\nCreated the operator account admin / admin (local demo database only).")
        database = settings.DATABASES["default"]["NAME"]
        self.stdout.write(
            "\nWhere to look: .venv/bin/python manage.py runserver, then open\n"
            "  http://127.0.0.1:8000/admin/executions/executionstate/   (executions, their events and responses)\n"
            "  http://127.0.0.1:8000/admin/django_q/                    (worker cluster, failed tasks)\n"
            f"Database: {database}\n"
            "CLI: .venv/bin/python manage.py obelisk_list | obelisk_status <id> --history --logs --tree | "
            "obelisk_submit | obelisk_cancel"
        )
