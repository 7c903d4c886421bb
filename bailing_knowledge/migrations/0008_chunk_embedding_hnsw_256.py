"""An HNSW index for 256-dimension vectors, the WordLlama embedder's size.

With pgvector's default graph (m 16, ef_construction 64): WordLlama's vectors lose recall in
the sparser graph of the 384-dimension index (database.hnsw_parameters).

Created only if no index of that name exists: hosts that followed the earlier advice to add
one for their size may have it already. The build holds off writes to the chunk table while
it runs, which takes a moment when no chunk has 256 dimensions; a host with many such chunks
can first build it without blocking writes, `manage.py knowledge_vector_index --dimensions
256`, and this migration then finds it in place.
"""

import django.contrib.postgres.indexes
import django.db.models.functions.comparison
import pgvector.django.halfvec
import pgvector.django.indexes
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bailing_knowledge", "0007_lexical_gin_pending_list"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    "CREATE INDEX IF NOT EXISTS bk_chunk_embedding_hnsw_256 "
                    "ON bailing_knowledge_chunk "
                    "USING hnsw ((embedding::halfvec(256)) halfvec_cosine_ops) "
                    "WITH (m = 16, ef_construction = 64) WHERE embedding_dimensions = 256",
                    reverse_sql="DROP INDEX IF EXISTS bk_chunk_embedding_hnsw_256",
                ),
            ],
            state_operations=[
                migrations.AddIndex(
                    model_name="chunk",
                    index=pgvector.django.indexes.HnswIndex(
                        django.contrib.postgres.indexes.OpClass(
                            django.db.models.functions.comparison.Cast(
                                "embedding",
                                pgvector.django.halfvec.HalfVectorField(dimensions=256),
                            ),
                            name="halfvec_cosine_ops",
                        ),
                        condition=models.Q(("embedding_dimensions", 256)),
                        ef_construction=64,
                        m=16,
                        name="bk_chunk_embedding_hnsw_256",
                    ),
                ),
            ],
        ),
    ]
