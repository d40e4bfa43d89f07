"""``manage.py obelisk_deploy``: deployments from a manifest (issue 38 part 2, spec 000 §7.4).

``create obelisk.toml`` imports the manifest's components, checks them and stores the
deployment (idempotent: the same manifest and code print the same id); ``list``, ``show
ID``, ``diff A B`` read; ``activate ID`` makes it active at once, ``enqueue ID`` when a
worker serving it starts (``obelisk_worker``); ``gc`` deletes the stored files no
deployment references; ``upgrade [--dry-run] FROM TO`` replays the in-flight workflows of
FROM against TO's code, imported here (``workers.upgrade``), and moves the clean ones.
Every error is one line and a non-zero exit status.
why: D110, D111.
"""

from __future__ import annotations

import getpass
import json
from pathlib import Path

from django.core.management.base import CommandError

from deployments.inspection import describe_lines, diff_lines
from deployments.manifest import ManifestError, read_manifest
from executions import catalog, store
from executions.ids import parse_deployment_id
from executions.management.commands._cli import EXIT_ERROR, ObeliskCommand, cli_actor, one_line


class Command(ObeliskCommand):
    help = "Create, list, show, compare, activate and enqueue deployments made from a manifest (obelisk.toml)."

    def add_arguments(self, parser):
        commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = commands.add_parser("create", help="store the deployment of a manifest and this code; prints its id")
        create.add_argument("manifest", help="path of the manifest, e.g. obelisk.toml")
        commands.add_parser("list", help="every deployment, newest first")
        for action, what in (
            ("show", "one deployment"),
            ("activate", "make it active now"),
            ("enqueue", "make it active when a worker serving it starts"),
        ):
            commands.add_parser(action, help=what).add_argument("deployment_id", metavar="ID")
        diff = commands.add_parser("diff", help="components, functions and settings that changed from A to B")
        diff.add_argument("a", metavar="A")
        diff.add_argument("b", metavar="B")
        commands.add_parser("gc", help="delete the stored source files no deployment references")
        upgrade = commands.add_parser(
            "upgrade", help="move FROM's in-flight executions to TO's code (this checkout's) where they replay cleanly"
        )
        upgrade.add_argument("a", metavar="FROM")
        upgrade.add_argument("b", metavar="TO")
        upgrade.add_argument("--dry-run", action="store_true", help="replay and report; write nothing")
        upgrade.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")

    def handle(self, *args, action, **options):
        names = ("manifest", "deployment_id", "a", "b") + (("dry_run", "json") if action == "upgrade" else ())
        getattr(self, f"_{action}")(**{k: v for k, v in options.items() if k in names})

    def _create(self, manifest):
        from workers.components import new_deployment  # imports the user's code

        try:
            new = new_deployment(read_manifest(manifest), created_by=_user())
        except ManifestError as error:
            raise CommandError(f"invalid_manifest: {one_line(str(error), 1000)}", returncode=EXIT_ERROR) from None
        deployment_id, _ = store.create_deployment(new)
        self.stdout.write(deployment_id)

    def _list(self):
        for info in catalog.list_deployments():
            description = f"  {info.description}" if info.description else ""
            self.stdout.write(
                f"{info.deployment_id}  {info.status:<8}  {info.created_at:%Y-%m-%d %H:%M:%S}  {info.digest}{description}"
            )

    def _show(self, deployment_id):
        for line in describe_lines(_record(deployment_id)):
            self.stdout.write(line)

    def _diff(self, a, b):
        lines = diff_lines(_record(a), _record(b))
        for line in lines or ["no difference"]:
            self.stdout.write(line)

    def _activate(self, deployment_id):
        parse_deployment_id(deployment_id)
        store.activate_deployment(deployment_id)
        self.stdout.write(f"{deployment_id} is active")

    def _enqueue(self, deployment_id):
        parse_deployment_id(deployment_id)
        if store.enqueue_deployment(deployment_id) == "already_active":
            self.stdout.write(f"{deployment_id} is already active")
        else:
            self.stdout.write(f"{deployment_id} is enqueued: it becomes active when a worker serving it starts")

    def _gc(self):
        self.stdout.write(f"deleted {store.gc_orphan_files()} orphan file(s)")

    def _upgrade(self, a, b, dry_run, json):
        from workers import upgrade
        from workers.components import load_deployment  # imports the user's code, checked against TO

        parse_deployment_id(a)
        parse_deployment_id(b)
        from workers.registry import RegistrationError

        try:
            functions = load_deployment(b)
        except RegistrationError as error:  # this checkout is not TO's code
            raise CommandError(f"deployment_mismatch: {one_line(str(error), 1000)}", returncode=EXIT_ERROR) from None
        report = upgrade.dry_run(a, b, functions)
        self._print_report(report, dry_run)
        if json:
            _write_json(json, report.as_json())
            self.stdout.write(f"report written to {json}")
        if dry_run:
            return
        moved, refused = upgrade.apply(report, actor=cli_actor(), via="cli")
        self.stdout.write(f"moved {len(moved)} execution(s) to {b}")
        for execution_id, why in refused:
            self.stdout.write(f"  not moved {execution_id}: {why}")
        if report.nondeterministic:
            self.stdout.write(
                f"{len(report.nondeterministic)} stay on {a}: drain them with `obelisk_worker --deployment {a}` "
                "from a checkout of its code, or guard the change with ctx.patched() and deploy again (D112)"
            )

    def _print_report(self, report, dry_run: bool) -> None:
        what = "dry run of the upgrade" if dry_run else "upgrade"
        self.stdout.write(
            f"{what} {report.from_deployment} -> {report.to_deployment}: "
            f"{len(report.clean)} clean, {len(report.nondeterministic)} nondeterministic"
        )
        for verdict in report.verdicts:
            word = "clean" if verdict.clean else "nondeterministic"
            note = f"  ({verdict.note})" if verdict.note else ""
            self.stdout.write(f"  {word:<16}  {verdict.execution_id}  {verdict.ffqn}{note}")
            for line in (verdict.message or "").splitlines():
                self.stdout.write(f"      {line}")


def _write_json(path: str, document: dict) -> None:
    try:
        Path(path).write_text(json.dumps(document, indent=2) + "\n")
    except OSError as error:
        raise CommandError(f"cannot write {path}: {error.strerror}", returncode=EXIT_ERROR) from None


def _record(deployment_id: str) -> store.DeploymentRecord:
    parse_deployment_id(deployment_id)  # a malformed id is `invalid_id`, before any query
    return store.get_deployment_record(deployment_id)


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None
