"""Two more statements of every search as PL/pgSQL functions: the fetch of its hits and
the statistics of its query terms.

Django binds parameters on the client, so PostgreSQL planned both anew on every search; the
fetch's plan cost about as much as running it (0.13 against 0.21 ms at a million chunks).
PL/pgSQL keeps the plan of a function's query for the life of the connection, behind
transaction-pooling proxies too (migration 0006 says more). Only statements whose answers
are small go this way: a function hands its rows on once it has all of them, and the
lexical rounds' rows are scored as they arrive.

Parameters and result columns are prefixed `p_` so that no name in a body can be read as a
column. STABLE: they only read, in the calling statement's snapshot.
"""

from django.db import migrations

# The hits to return, checked against their documents as they are now: ready, at the
# chunk's revision, in a knowledge base searched, and the chunk's text still the body's at
# its offsets (`substr` counts characters, as Python does). A stale chunk is left out. The
# document is a lateral lookup by key (`OFFSET 0` keeps it one) rather than a join, whose
# join orders and methods cost the planner twice as long for the same plan.
FETCH_HITS = """
CREATE FUNCTION bailing_knowledge_fetch_hits(p_ids bigint[], p_kbs bigint[])
RETURNS TABLE (
    p_id bigint, p_document_id bigint, p_knowledge_base_id bigint, p_revision integer,
    p_start integer, p_end integer, p_text text, p_title varchar, p_content_hash varchar
) LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT c.id, c.document_id, c.knowledge_base_id, c.revision, c."start", c."end",
           c."text", d.title, d.content_hash
    FROM bailing_knowledge_chunk c,
    LATERAL (
        SELECT d.title, d.content_hash, d.body FROM bailing_knowledge_document d
        WHERE d.id = c.document_id AND d.status = 'ready' AND d.revision = c.revision
          AND d.knowledge_base_id = ANY(p_kbs)
        OFFSET 0
    ) d
    WHERE c.id = ANY(p_ids)
      AND substr(d.body, c."start" + 1, c."end" - c."start") = c."text";
END $$
"""

# BM25's figures for the terms over the knowledge bases searched: chunks holding each term,
# their summed length and the highest level of its postings; the empty term is every KB's
# totals (`LexiconTerm`).
TERM_STATISTICS = """
CREATE FUNCTION bailing_knowledge_term_statistics(p_kbs bigint[], p_terms text[])
RETURNS TABLE (p_term varchar, p_chunks numeric, p_length numeric, p_top smallint)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT l.term, sum(l.chunks), sum(l.length), max(l.top)
    FROM bailing_knowledge_lexicon l
    WHERE l.knowledge_base_id = ANY(p_kbs) AND l.term = ANY(p_terms)
    GROUP BY l.term;
END $$
"""

DROP_FETCH_HITS = "DROP FUNCTION IF EXISTS bailing_knowledge_fetch_hits(bigint[], bigint[])"
DROP_TERM_STATISTICS = "DROP FUNCTION IF EXISTS bailing_knowledge_term_statistics(bigint[], text[])"


class Migration(migrations.Migration):
    dependencies = [("bailing_knowledge", "0012_document_queued_hash")]

    operations = [
        migrations.RunSQL([FETCH_HITS], reverse_sql=[DROP_FETCH_HITS]),
        migrations.RunSQL([TERM_STATISTICS], reverse_sql=[DROP_TERM_STATISTICS]),
    ]
