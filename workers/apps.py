from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"
    # A unique label: a host project may have its own `workers` app (decisions.md D49).
    label = "obelisk_workers"
    verbose_name = "Workers"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django_q.signals import post_spawn

        from workers.shutdown import install_worker_handler

        # Each django-q2 worker process stops gracefully on SIGTERM (workers/shutdown.py).
        post_spawn.connect(install_worker_handler, dispatch_uid="obelisk_worker_sigterm")
