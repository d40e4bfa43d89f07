from executions import client
from executions.management.commands._cli import ExecutionActionCommand


class Command(ExecutionActionCommand):
    help = "Retry a finished execution: submit its function and arguments again as a new execution linked to it."

    def act(self, execution_id: str, actor: str) -> str:
        return client.retry(execution_id, actor=actor, via="cli").execution_id
