from executions import client
from executions.management.commands._cli import ObeliskCommand, cli_actor


class Command(ObeliskCommand):
    help = "Make a scheduled (or backing-off) pending execution due now."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def handle(self, *args, execution_id, **options):
        client.run_now(execution_id, actor=cli_actor(), via="cli")
        self.stdout.write(f"{execution_id}: due now")
