from executions import store
from workers.management.commands._cli import ObeliskCommand


class Command(ObeliskCommand):
    help = "Cancel an execution: a pending one is finished as cancelled by the next sweep, a running one is stopped."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def handle(self, *args, execution_id, **options):
        outcome = store.cancel(execution_id)
        self.stdout.write(f"{execution_id}: {outcome.value.replace('_', ' ')}")
