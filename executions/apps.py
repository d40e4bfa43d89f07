from django.apps import AppConfig
from django.db.backends.signals import connection_created


def _load_json_as_text(sender, connection, **kwargs):
    """psycopg parses ``json`` columns itself; the store wants the exact text
    (``models.ExactJSONField``), as Django already arranges for ``jsonb``."""
    if connection.vendor == "postgresql":
        from psycopg.types.string import TextLoader

        connection.connection.adapters.register_loader("json", TextLoader)


class ExecutionsConfig(AppConfig):
    name = "executions"
    # A unique label: a host project may have its own `executions` app (decisions.md D49).
    label = "obelisk_executions"
    verbose_name = "Executions"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        connection_created.connect(_load_json_as_text, dispatch_uid="obelisk_json_as_text")
