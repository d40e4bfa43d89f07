from django.core.management.base import BaseCommand

from executions import errors, store
from workers.management.commands._cli import fail


class Command(BaseCommand):
    help = "Cancel an execution: a pending one is finished as cancelled by the next sweep, a running one is stopped."

    def add_arguments(self, parser):
        parser.add_argument("execution_id")

    def handle(self, *args, execution_id, **options):
        try:
            outcome = store.cancel(execution_id)
        except errors.StoreError as error:
            raise fail(error) from None
        self.stdout.write(f"{execution_id}: {outcome.value.replace('_', ' ')}")
