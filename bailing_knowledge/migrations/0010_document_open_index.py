"""An index of the documents everyone may see, so the lexical leg's checks skip their rows.

Before a chunk can rank, the lexical leg checks its document: ready, at the chunk's
revision, no audience or role restriction that keeps the caller out. For a document open to
everyone that check is answered by this partial index alone (an index-only scan), without
reading the document's row; restricted documents are checked on their row as before. The
index holds two integers per open document: it is built in a moment, and kept as documents
are written.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("bailing_knowledge", "0009_document_reindex_queued_at"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="document",
            index=models.Index(
                condition=models.Q(
                    ("status", "ready"),
                    models.Q(("metadata__has_key", "audiences"), _negated=True),
                    models.Q(("metadata__has_key", "roles"), _negated=True),
                ),
                fields=["id", "revision"],
                name="bk_document_open",
            ),
        ),
    ]
