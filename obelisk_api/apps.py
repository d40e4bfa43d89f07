from django.apps import AppConfig


class ObeliskApiConfig(AppConfig):
    name = "obelisk_api"
    label = "obelisk_api"
    verbose_name = "API"
    default_auto_field = "django.db.models.BigAutoField"
