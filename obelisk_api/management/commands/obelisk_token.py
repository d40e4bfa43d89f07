"""``obelisk_token create|list|revoke``: API tokens for ``Authorization: Bearer``."""

from django.core.management.base import BaseCommand, CommandError

from obelisk_api import tokens


class Command(BaseCommand):
    help = "Manage API tokens: create one for a user (printed once), list them, revoke one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token for a user; it is printed once and never again")
        create.add_argument("username")
        create.add_argument("--name", default="", help="what the token is for")
        listing = sub.add_parser("list", help="tokens (all, or one user's): id, prefix, user, name, use, state")
        listing.add_argument("username", nargs="?")
        revoke = sub.add_parser("revoke", help="revoke a token by its id or prefix")
        revoke.add_argument("token", metavar="prefix-or-id")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except tokens.TokenError as error:
            raise CommandError(str(error)) from None

    def _create(self, username, name, **_):
        issued = tokens.issue(username, name)
        self.stdout.write(issued.token)
        self.stderr.write(
            f"token {issued.record.pk} ({issued.record.prefix}…) for {username}: keep it now, it is not shown again"
        )

    def _list(self, username=None, **_):
        for record in tokens.list_tokens(username):
            state = f"revoked {record.revoked_at:%Y-%m-%d %H:%M}" if record.revoked_at else "active"
            used = f"{record.last_used_at:%Y-%m-%d %H:%M}" if record.last_used_at else "never"
            self.stdout.write(
                f"{record.pk:>5}  {record.prefix}…  {record.user.username:<20} {record.name or '-':<20} "
                f"created {record.created_at:%Y-%m-%d %H:%M}  used {used}  {state}"
            )

    def _revoke(self, token, **_):
        record = tokens.revoke(token)
        self.stdout.write(f"revoked token {record.pk} ({record.prefix}…) of {record.user.username}")
