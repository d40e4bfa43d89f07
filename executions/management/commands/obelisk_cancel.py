from executions import client
from executions.management.commands._cli import ExecutionActionCommand


class Command(ExecutionActionCommand):
    help = "Cancel an execution: a pending one is finished as cancelled by the next sweep, a running one is stopped."

    def act(self, execution_id: str, actor: str) -> str:
        outcome = client.cancel(execution_id, actor=actor, via="cli")
        return f"{execution_id}: {outcome.value.replace('_', ' ')}"
