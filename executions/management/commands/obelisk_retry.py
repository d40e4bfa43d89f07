from executions import client
from executions.management.commands._cli import ObeliskCommand, cli_actor


class Command(ObeliskCommand):
    help = "Retry a finished execution: submit its function and arguments again as a new execution linked to it."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def handle(self, *args, execution_id, **options):
        submitted = client.retry(execution_id, actor=cli_actor(), via="cli")
        self.stdout.write(submitted.execution_id)
