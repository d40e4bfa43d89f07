"""D128: ``t_state_id_prefix`` duplicated the ``varchar_pattern_ops`` index Django makes for
the text primary key on PostgreSQL (and the primary key itself on SQLite): every write of
``t_state`` paid for an index no query needed."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("obelisk_executions", "0012_schedules_and_webhooks"),
    ]

    operations = [
        migrations.RemoveIndex(model_name="executionstate", name="t_state_id_prefix"),
    ]
