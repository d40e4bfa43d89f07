"""Issuing, checking and revoking API tokens (``ApiToken``).

A token is 43 random URL-safe characters shown once, when it is created; the database keeps
its SHA-256 only. Looking one up is an indexed equality on that hash, so checking a token
costs one query and reveals nothing by timing about other tokens.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from obelisk_api.models import ApiToken

PREFIX_CHARS = 8
# ``last_used_at`` is refreshed at most this often: a busy client must not turn every
# read into a write.
TOUCH_EVERY = timedelta(minutes=1)


class TokenError(Exception):
    """A token command cannot do what was asked (unknown user, ambiguous prefix…)."""


@dataclass(frozen=True)
class Issued:
    token: str  # the secret: shown once, never stored
    record: ApiToken


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def issue(username: str, name: str = "") -> Issued:
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise TokenError(f"no user `{username}`")
    token = _new_token()
    record = ApiToken.objects.create(
        user=user, name=name, prefix=token[:PREFIX_CHARS], token_hash=digest(token), created_at=timezone.now()
    )
    return Issued(token, record)


def _new_token() -> str:
    """43 random URL-safe characters, never starting with ``-``: its prefix is given to
    ``obelisk_token revoke``, where a leading ``-`` would read as an option."""
    while (token := secrets.token_urlsafe(32)).startswith("-"):
        pass
    return token


def user_of(token: str):
    """The active user a live token belongs to, or None (unknown, revoked, user inactive)."""
    if not token or len(token) > 200:
        return None
    record = ApiToken.objects.select_related("user").filter(token_hash=digest(token), revoked_at__isnull=True).first()
    if record is None or not record.user.is_active:
        return None
    now = timezone.now()
    if record.last_used_at is None or now - record.last_used_at >= TOUCH_EVERY:
        ApiToken.objects.filter(pk=record.pk).update(last_used_at=now)
    return record.user


def list_tokens(username: str | None = None) -> list[ApiToken]:
    query = ApiToken.objects.select_related("user").order_by("created_at", "id")
    if username is not None:
        query = query.filter(user__username=username)
    return list(query)


def revoke(prefix_or_id: str) -> ApiToken:
    """Revoke the one token with this id or prefix; an ambiguous prefix revokes nothing."""
    query = ApiToken.objects.filter(prefix=prefix_or_id)
    if prefix_or_id.isdigit():
        query = ApiToken.objects.filter(pk=int(prefix_or_id)) | query
    found = list(query[:2])
    if not found:
        raise TokenError(f"no token with id or prefix `{prefix_or_id}`")
    if len(found) > 1:
        raise TokenError(f"`{prefix_or_id}` matches several tokens; revoke by id")
    record = found[0]
    if record.revoked_at is None:
        record.revoked_at = timezone.now()
        record.save(update_fields=["revoked_at"])
    return record
