"""Keep the lexical GIN index's pending list small, so that searches stay fast after writes."""

import django.contrib.postgres.indexes
from django.db import migrations

# New rows' index entries wait in the GIN index's pending list until it exceeds
# `gin_pending_list_limit` (4 MB by default) or a vacuum merges them, and every lookup scans
# the whole list. A lexical search makes dozens of lookups: after an ingestion of 2,000-4,000
# chunks into 100k, its median went up 1.7-3.5 times until the list was merged
# (docs/performance.md). At 128 kB the list is merged as it fills, during the writes. The
# change is a storage parameter: no rebuild, no lock beyond the catalog update.
FORWARD = "ALTER INDEX bk_chunk_search_vector_gin SET (gin_pending_list_limit = 128)"
REVERSE = "ALTER INDEX bk_chunk_search_vector_gin RESET (gin_pending_list_limit)"


class Migration(migrations.Migration):
    dependencies = [
        ("bailing_knowledge", "0006_access_functions"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(FORWARD, REVERSE, elidable=False)],
            state_operations=[
                migrations.RemoveIndex(model_name="chunk", name="bk_chunk_search_vector_gin"),
                migrations.AddIndex(
                    model_name="chunk",
                    index=django.contrib.postgres.indexes.GinIndex(
                        fields=["search_vector"],
                        gin_pending_list_limit=128,
                        name="bk_chunk_search_vector_gin",
                    ),
                ),
            ],
        ),
    ]
