"""API tokens: what a script or a service presents as ``Authorization: Bearer <token>``."""

from django.conf import settings
from django.db import models


class ApiToken(models.Model):
    """``t_api_token``: one issued token. Only its SHA-256 is kept, so a leaked database
    does not leak working tokens; ``prefix`` (its first characters) lets people tell their
    tokens apart in listings and revoke one without knowing the rest."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=8, db_index=True)
    token_hash = models.CharField(max_length=64, unique=True)  # hex SHA-256 of the token
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "t_api_token"
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name or 'unnamed'}, {self.user})"
