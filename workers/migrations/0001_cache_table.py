"""Create the database cache table: django-q2 keeps cluster statistics in Django's cache,
and only a shared (database) cache lets ``qinfo`` and the admin see every cluster."""

from django.core.management import call_command
from django.db import migrations


def create_cache_table(apps, schema_editor):
    call_command("createcachetable", database=schema_editor.connection.alias, verbosity=0)


class Migration(migrations.Migration):
    dependencies = []
    operations = [migrations.RunPython(create_cache_table, migrations.RunPython.noop)]
