from executions import client
from executions.management.commands._cli import ExecutionActionCommand


class Command(ExecutionActionCommand):
    help = "Resume a paused execution."

    def act(self, execution_id: str, actor: str) -> str:
        client.resume(execution_id, actor=actor, via="cli")
        return f"{execution_id}: resumed"
