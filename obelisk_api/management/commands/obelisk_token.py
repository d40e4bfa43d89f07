"""``obelisk_token create|list|revoke``: API tokens for ``Authorization: Bearer``.

Through the same error layer as the ``obelisk_*`` commands (``_cli.ObeliskCommand``): bad
input is one bounded line on stderr (``CommandError: <code>: …``) and writes nothing. The
arguments are checked here, before any query: text the database cannot hold (NUL, the lone
surrogates that invalid UTF-8 in argv becomes) would otherwise reach the driver as an
untyped error, and a name longer than its column is cut or refused depending on the database
(D107).
"""

import string

from django.contrib.auth import get_user_model

from executions import errors
from executions.management.commands._cli import ObeliskCommand, fail, invalid
from obelisk_api import tokens
from obelisk_api.models import ApiToken

# A token's prefix is drawn from ``secrets.token_urlsafe``'s alphabet; an id is a bigint, of
# which 18 ASCII digits always fit. Anything else cannot name a token.
TOKEN_ALPHABET = frozenset(string.ascii_letters + string.digits + "-_")
MAX_REFERENCE_CHARS = 18


class Command(ObeliskCommand):
    help = "Manage API tokens: create one for a user (printed once), list them, revoke one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token for a user; it is printed once and never again")
        create.add_argument("username")
        create.add_argument("--name", default="", help="what the token is for (at most 200 characters)")
        listing = sub.add_parser("list", help="tokens (all, or one user's): id, prefix, user, name, use, state")
        listing.add_argument("username", nargs="?")
        revoke = sub.add_parser("revoke", help="revoke a token by its id or prefix")
        revoke.add_argument("token", metavar="prefix-or-id")

    def handle(self, *args, action, **options):
        try:
            getattr(self, f"_{action}")(**options)
        except tokens.TokenError as error:
            raise fail(errors.NotFound(str(error))) from None

    def _create(self, username, name, **_):
        username = checked_text(username, "user name", _username_chars())
        name = checked_text(name, "--name", ApiToken._meta.get_field("name").max_length)
        issued = tokens.issue(username, name)
        self.stdout.write(issued.token)
        self.stderr.write(
            f"token {issued.record.pk} ({issued.record.prefix}…) for {username}: keep it now, it is not shown again"
        )

    def _list(self, username=None, **_):
        if username is not None:
            username = checked_text(username, "user name", _username_chars())
        for record in tokens.list_tokens(username):
            state = f"revoked {record.revoked_at:%Y-%m-%d %H:%M}" if record.revoked_at else "active"
            used = f"{record.last_used_at:%Y-%m-%d %H:%M}" if record.last_used_at else "never"
            self.stdout.write(
                f"{record.pk:>5}  {record.prefix}…  {record.user.username:<20} {record.name or '-':<20} "
                f"created {record.created_at:%Y-%m-%d %H:%M}  used {used}  {state}"
            )

    def _revoke(self, token, **_):
        token = checked_text(token, "prefix-or-id", MAX_REFERENCE_CHARS)
        if not token or not set(token) <= TOKEN_ALPHABET:
            raise invalid(
                f"prefix-or-id must be a token's id or its prefix (letters, digits, - and _), got `{errors.excerpt(token)}`"
            )
        record = tokens.revoke(token)
        self.stdout.write(f"revoked token {record.pk} ({record.prefix}…) of {record.user.username}")


def _username_chars() -> int:
    user_model = get_user_model()
    return user_model._meta.get_field(user_model.USERNAME_FIELD).max_length or 150


def checked_text(value: str, what: str, max_chars: int) -> str:
    """``value`` if the database can store and compare it: valid Unicode (invalid UTF-8 in
    argv arrives as lone surrogates), no NUL, at most ``max_chars`` characters."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise fail(errors.UnsupportedValue(f"{what} is not valid UTF-8: `{errors.excerpt(value)}`")) from None
    if "\x00" in value:
        raise fail(errors.UnsupportedValue(f"{what} contains a NUL character: `{errors.excerpt(value)}`"))
    if len(value) > max_chars:
        raise invalid(f"{what} must be at most {max_chars} characters, got `{errors.excerpt(value)}`")
    return value
