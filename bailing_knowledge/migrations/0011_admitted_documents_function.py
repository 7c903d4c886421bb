"""The document check a search sends with its fetch, as a PL/pgSQL function.

A search's lexical leg may leave the check of the chunks it ranks to the fetch (see
`retrieval/hybrid.py`): which of their documents admit the principal, at which revision.
Django binds parameters on the client, so a plain statement would be planned anew on every
search, and planning cost more than running it; PL/pgSQL keeps the plan of a function's
query for the life of the connection, behind transaction-pooling proxies too (migration
0006 says more). The conditions are `visibility.DOCUMENT_VISIBLE_SQL`'s for a document
alone; tests/retrieval/test_visibility.py checks that both agree.
"""

from django.db import migrations

# Parameters are prefixed `p_` so that no name in the body can be read as a column, and so
# are the result's columns. STABLE: it only reads, in the calling statement's snapshot.
FUNCTION = """
CREATE FUNCTION bailing_knowledge_admitted_documents(
    p_ids bigint[], p_audience text, p_roles text[]
) RETURNS TABLE (p_id bigint, p_revision integer) LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT d.id, d.revision FROM bailing_knowledge_document d
    WHERE d.id = ANY(p_ids)
      AND d.status = 'ready'
      AND (NOT d.metadata ? 'audiences' OR d.metadata -> 'audiences' ? p_audience)
      AND (NOT d.metadata ? 'roles' OR d.metadata -> 'roles' ?| p_roles);
END $$
"""

DROP_FUNCTION = (
    "DROP FUNCTION IF EXISTS bailing_knowledge_admitted_documents(bigint[], text, text[])"
)


class Migration(migrations.Migration):
    dependencies = [("bailing_knowledge", "0010_document_open_index")]

    operations = [migrations.RunSQL([FUNCTION], reverse_sql=[DROP_FUNCTION])]
