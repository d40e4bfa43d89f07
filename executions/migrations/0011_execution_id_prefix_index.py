from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("obelisk_executions", "0010_console_indexes"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="executionstate",
            index=models.Index(fields=["execution_id"], name="t_state_id_prefix", opclasses=["varchar_pattern_ops"]),
        ),
    ]
