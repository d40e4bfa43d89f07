import os
import signal
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connections


class Command(BaseCommand):
    help = (
        "Start a worker cluster: django-q2 processes that claim and run activities, "
        "plus the timer sweep. Run one per host; several can share one PostgreSQL. "
        "SIGTERM or SIGINT stops it in order: nothing more is claimed, unstarted executions "
        "are handed back at once, running ones get OBELISK['SHUTDOWN_GRACE'] to finish."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workers", type=int, help="worker processes (default: OBELISK_WORKERS or 2)")
        parser.add_argument(
            "--deployment",
            metavar="ID",
            help="serve this deployment (Dep_…) from a checkout of its code, e.g. to drain the executions "
            "pinned to it; default: the current deployment (enqueued, else active), or the imported modules",
        )

    def handle(self, *args, workers, deployment=None, **options):
        from django_q.brokers import get_broker
        from django_q.cluster import Cluster
        from django_q.conf import Conf

        from workers import doorbell, heartbeat, lingering, shutdown, telemetry
        from workers.components import SERVED_DEPLOYMENT_VARIABLE, serve
        from workers.sweeper import SweeperThread

        if workers:
            Conf.WORKERS = workers
            Conf.QUEUE_LIMIT = workers * 2
        deployment_id, functions = self._serve(serve, deployment)
        os.environ[SERVED_DEPLOYMENT_VARIABLE] = deployment_id  # the cluster's processes serve the same
        self.stdout.write(
            f"worker cluster: {Conf.WORKERS} process(es), deployment {deployment_id}, "
            f"{len(functions)} function(s): {', '.join(sorted(functions))}"
        )
        self.stdout.flush()
        shutdown.prepare_cluster()
        lingering.prepare_cluster()
        doorbell.prepare_cluster(Conf.WORKERS)
        heartbeat.prepare_cluster()
        connections.close_all()  # the cluster's processes are forked: they must not share it
        cluster = Cluster(get_broker())

        def stop(signum, frame):
            """Tell every process of the cluster to stop: the shared flag, and nothing that
            takes a lock, because the next signal may run this again inside it (D85). The
            loop below passes the stop on to django-q2's sentinel."""
            shutdown.request_cluster_stop()

        signal.signal(signal.SIGTERM, stop)  # replaces django-q2's handler, which blocks in it
        signal.signal(signal.SIGINT, stop)
        cluster.start()
        # After the fork: the cluster's processes set up their own exporters (workers.tasks).
        if telemetry.setup_from_environment():
            telemetry.observe_backlog()
        sweeper = SweeperThread()
        sweeper.start()
        beat = heartbeat.HeartbeatThread(processes=Conf.WORKERS, functions=list(functions), deployment_id=deployment_id)
        beat.start()
        self._wait_for_the_sentinel(cluster, shutdown.stopping)
        beat.stop()  # records the cluster as stopped
        sweeper.stop()
        telemetry.shutdown()
        self.stdout.write("worker cluster stopped")

    @staticmethod
    def _serve(serve, deployment_id: str | None) -> tuple[str, dict]:
        """The deployment and functions to serve, or one line that says what is wrong and
        where (a module that does not exist, a decorator mistake, code that is not the
        deployment's, an unknown deployment), instead of a traceback (issue 36 item 10)."""
        from executions import errors
        from workers.registry import RegistrationError

        try:
            return serve(deployment_id)
        except RegistrationError as error:
            where = f" ({error.where})" if error.where else ""
            raise CommandError(f"{error}{where}") from None
        except (errors.NotFound, errors.ValidationFailed) as error:  # an unknown deployment, a bad @schedule
            raise CommandError(str(error)) from None

    @staticmethod
    def _wait_for_the_sentinel(cluster, stopping) -> None:
        """Until the sentinel has stopped the pool. Once the cluster is told to stop
        (``stopping()``: a signal, possibly before the sentinel existed), have the sentinel
        stop the pool: it waits for the workers to hand back and finish."""
        passed_on = False
        while cluster.sentinel is not None and cluster.sentinel.is_alive():
            if not passed_on and stopping():
                cluster.stop_event.set()
                passed_on = True
            time.sleep(0.1)
