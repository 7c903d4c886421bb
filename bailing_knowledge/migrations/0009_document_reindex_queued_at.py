"""`Document.reindex_queued_at`: when a document's queued re-index was queued, until it runs.

A nullable column without a default: adding it rewrites no row and holds the table's lock
only for a moment.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bailing_knowledge", "0008_chunk_embedding_hnsw_256"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="reindex_queued_at",
            field=models.DateTimeField(
                blank=True, editable=False, null=True, verbose_name="re-index queued at"
            ),
        ),
    ]
