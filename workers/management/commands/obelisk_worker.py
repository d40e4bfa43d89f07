import time

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Start a worker cluster: django-q2 processes that claim and run activities, "
        "plus the timer sweep. Run one per host; several can share one PostgreSQL."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int, help="worker processes (default: OBELISK_WORKERS or 2)")

    def handle(self, *args, workers, **options):
        from django_q.brokers import get_broker
        from django_q.cluster import Cluster
        from django_q.conf import Conf

        from deployments.registration import ensure_code_deployment
        from workers.registry import load_components

        if workers:
            Conf.WORKERS = workers
            Conf.QUEUE_LIMIT = workers * 2
        functions = load_components()
        deployment_id = ensure_code_deployment(functions, activate=True)
        self.stdout.write(
            f"worker cluster: {Conf.WORKERS} process(es), deployment {deployment_id}, "
            f"{len(functions)} function(s): {', '.join(sorted(functions))}"
        )
        self.stdout.flush()
        cluster = Cluster(get_broker())
        cluster.start()
        while cluster.sentinel is not None and cluster.sentinel.is_alive():
            time.sleep(0.5)
