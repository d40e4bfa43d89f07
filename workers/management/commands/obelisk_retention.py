import re
from datetime import timedelta

from django.core.management.base import CommandError
from django.utils import timezone

from executions import errors, store
from executions.management.commands._cli import EXIT_USAGE, MAX_SECONDS, ObeliskCommand, invalid
from workers import retention

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_RE = re.compile(r"^([0-9]{1,12})([smhd])$")


def parse_duration(text: str, option: str = "--older-than") -> timedelta:
    """``30d``, ``12h``, ``90m`` or ``45s``: a whole number of days, hours, minutes or
    seconds, from 1 second to 100 years."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise invalid(f"{option} must be a duration like 30d, 12h, 90m or 45s, got `{errors.excerpt(text)}`")
    seconds = int(match[1]) * UNITS[match[2]]
    if not 1 <= seconds <= MAX_SECONDS:
        raise invalid(
            f"{option} must be from 1 second to {MAX_SECONDS // 86400} days (100 years), got `{errors.excerpt(text)}`"
        )
    return timedelta(seconds=seconds)


class Command(ObeliskCommand):
    help = (
        "Delete finished executions older than --older-than (default: the RETENTION setting), each with "
        "every execution started in its join sets and everything that belongs to them, in short batches "
        "that never wait for a row a worker holds. A tree in which anything still runs is kept whole."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than", help="finished longer ago than this: 30d, 12h, 90m, 45s (default: OBELISK['RETENTION'])"
        )
        parser.add_argument(
            "--batch-size", type=int, help="top-level executions per transaction (default: RETENTION_BATCH_SIZE)"
        )
        parser.add_argument("--dry-run", action="store_true", help="only count what would be deleted")
        parser.add_argument(
            "--schedule",
            action="store_true",
            help=f"instead of deleting now, create or update the hourly django-q2 schedule `{retention.SCHEDULE_NAME}` "
            "(with --older-than it keeps that age, without it follows the setting)",
        )

    def handle(self, *args, older_than, batch_size, dry_run, schedule, **options):
        if schedule and (dry_run or batch_size is not None):
            raise CommandError("usage_error: --schedule takes only --older-than", returncode=EXIT_USAGE)
        age = parse_duration(older_than) if older_than is not None else retention.configured_retention()
        if age is None:
            raise invalid("no retention: give --older-than (e.g. 30d) or set OBELISK['RETENTION']")
        if schedule:
            seconds = int(age.total_seconds()) if older_than is not None else None
            created = retention.ensure_schedule(seconds)
            follows = (
                f"older than {older_than.strip()}" if older_than is not None else "older than the RETENTION setting"
            )
            verb = "created" if created else "updated"
            self.stdout.write(f"{verb} hourly schedule {retention.SCHEDULE_NAME}: {retention.SCHEDULE_FUNC}, {follows}")
            return
        cutoff = timezone.now() - age
        deleted = store.delete_finished(
            cutoff,
            batch_size=batch_size if batch_size is not None else retention.configured_batch_size(),
            dry_run=dry_run,
        )
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(f"{verb} {deleted} execution(s) finished before {cutoff.isoformat(timespec='seconds')}")
