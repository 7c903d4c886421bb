"""`Document.queued_hash`: the content a serving document was last asked to take, so that a
queued edit overtaken by newer content gives way.

An empty-string default: PostgreSQL stores it in the catalog, so adding the column rewrites
no row and holds the table's lock only for a moment.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bailing_knowledge", "0011_admitted_documents_function"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="queued_hash",
            field=models.CharField(blank=True, default="", editable=False, max_length=64),
        ),
    ]
