from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"
    # A unique label: a host project may have its own `deployments` app (decisions.md D49).
    label = "obelisk_deployments"
    verbose_name = "Deployments"
    default_auto_field = "django.db.models.BigAutoField"
