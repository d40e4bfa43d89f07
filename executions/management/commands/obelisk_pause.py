from executions import client
from executions.management.commands._cli import ObeliskCommand, cli_actor


class Command(ObeliskCommand):
    help = "Pause a pending or blocked execution (a running workflow is unlocked first); resume it with obelisk_resume."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def handle(self, *args, execution_id, **options):
        client.pause(execution_id, actor=cli_actor(), via="cli")
        self.stdout.write(f"{execution_id}: paused")
