from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "deployments"
    verbose_name = "Deployments"
    default_auto_field = "django.db.models.BigAutoField"
