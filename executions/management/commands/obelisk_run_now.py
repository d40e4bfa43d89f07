from executions import client
from executions.management.commands._cli import ExecutionActionCommand


class Command(ExecutionActionCommand):
    help = "Make a scheduled (or backing-off) pending execution due now."

    def act(self, execution_id: str, actor: str) -> str:
        client.run_now(execution_id, actor=actor, via="cli")
        return f"{execution_id}: due now"
