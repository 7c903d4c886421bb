"""Store document bodies uncompressed out of line: a read page's slice needs no decompression."""

from django.db import migrations

# A read page takes `substr(body, ...)` of the body and its `octet_length`. Stored EXTERNAL
# (out of line, uncompressed), the slice is a read of the TOAST chunks up to its end (in a
# UTF-8 database `substr` counts characters from the start) with nothing to decompress, and
# the size comes from the TOAST pointer alone. The change is to the catalog only: existing
# rows keep their compressed form until they are next written (a new revision), and read the
# same meanwhile, only slower. Rewriting them here would keep the table locked for as long as
# every body takes to rewrite; docs/api.md shows the statement that converts them at a
# convenient time.
FORWARD = "ALTER TABLE bailing_knowledge_document ALTER COLUMN body SET STORAGE EXTERNAL"
REVERSE = "ALTER TABLE bailing_knowledge_document ALTER COLUMN body SET STORAGE EXTENDED"


class Migration(migrations.Migration):
    dependencies = [
        ("bailing_knowledge", "0003_knowledgebase_language"),
    ]

    operations = [
        migrations.RunSQL(FORWARD, REVERSE, elidable=False),
    ]
