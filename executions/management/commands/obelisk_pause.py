from executions import client
from executions.management.commands._cli import ExecutionActionCommand


class Command(ExecutionActionCommand):
    help = "Pause a pending or blocked execution (a running workflow is unlocked first); resume it with obelisk_resume."

    def act(self, execution_id: str, actor: str) -> str:
        client.pause(execution_id, actor=actor, via="cli")
        return f"{execution_id}: paused"
