from django.core.management.base import BaseCommand

from executions.state_machine import transition_matrix_markdown


class Command(BaseCommand):
    help = "Print the execution state machine (event x state) as a Markdown table."

    def handle(self, *args, **options):
        self.stdout.write(transition_matrix_markdown())
