from executions import client
from executions.management.commands._cli import ObeliskCommand, cli_actor


class Command(ObeliskCommand):
    help = "Cancel an execution: a pending one is finished as cancelled by the next sweep, a running one is stopped."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def handle(self, *args, execution_id, **options):
        outcome = client.cancel(execution_id, actor=cli_actor(), via="cli")
        self.stdout.write(f"{execution_id}: {outcome.value.replace('_', ' ')}")
