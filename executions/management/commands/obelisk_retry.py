from executions import client, store
from executions.management.commands._cli import ExecutionActionCommand


class Command(ExecutionActionCommand):
    help = (
        "Retry a finished execution: submit its function and arguments again as a new execution linked to it. "
        "Prints `<old id>: <function> retried as <new id>`."
    )

    def act(self, execution_id: str, actor: str) -> str:
        """Says what it retried, not just the new id: an operator pasting an id must see
        which execution and function the new one repeats (D107)."""
        new_id = client.retry(execution_id, actor=actor, via="cli").execution_id
        old = store.get_state(execution_id)
        return f"{old.execution_id}: {old.ffqn} retried as {new_id}"
