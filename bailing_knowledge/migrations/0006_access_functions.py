"""The per-request access checks as PL/pgSQL functions, called by `access.py`.

Django binds parameters on the client, so PostgreSQL planned the seven-table statement of a
live session and its route anew on every agent call, and planning cost more than running
it. PL/pgSQL keeps the plans of a function's queries for the life of the connection, which
also holds behind transaction-pooling proxies, where server-side prepared statements do not.

Each function returns a JSON object that holds the rows `access.py` turns into model
instances, every row keyed by its columns. The column lists are fixed here: a migration that
adds, removes or renames a field of AgentSession, Client, Route or KnowledgeBase must replace
the functions (CREATE OR REPLACE FUNCTION, with this migration's bodies amended). The tests
compare the functions' keys with the models' concrete fields (tests/test_authentication.py,
tests/test_permissions.py) and fail until it does.
"""

from django.db import migrations

# Each model's columns, in `_meta.concrete_fields` order.
SESSION = [
    "id",
    "session_id",
    "client_id",
    "principal_id",
    "principal_tenant",
    "principal_roles",
    "principal_audience",
    "on_behalf_of",
    "token_hash",
    "token_hint",
    "device_label",
    "created_at",
    "expires_at",
    "revoked_at",
    "last_seen_at",
]
CLIENT = ["id", "app_id", "name", "enabled", "created_at", "updated_at"]
ROUTE = [
    "id",
    "route_key",
    "name",
    "enabled",
    "allowed_audiences",
    "agent_client_enabled",
    "knowledge_enabled",
    "top_k",
    "min_score",
    "max_docs",
    "knowledge_mode",
    "created_at",
    "updated_at",
]
KNOWLEDGE_BASE = [
    "id",
    "slug",
    "title",
    "description",
    "enabled",
    "embedder",
    "tenant",
    "language",
    "created_at",
    "updated_at",
]


def _object(alias, columns):
    """The row `alias` as a JSON object keyed by column name."""
    pairs = ", ".join(f"'{column}', {alias}.{column}" for column in columns)
    return f"json_build_object({pairs})"


# A session `s` of a client `c` is live: not revoked, not expired, its client enabled.
# (`AgentSession.is_active` is the same rule in Python, for rows already loaded.)
SESSION_LIVE = (
    "s.token_hash = p_token_hash AND s.revoked_at IS NULL AND s.expires_at > p_now AND c.enabled"
)

# A route `r` admits the session `{session_id}` of client `{client_id}` whose principal's
# audience is `{audience}`: enabled, its Agent Client runtime on, among both the client's
# and the session's routes, and the audience admitted (an empty list admits every one).
ROUTE_ADMITS = """r.route_key = p_route_key AND r.enabled AND r.agent_client_enabled
        AND (cardinality(r.allowed_audiences) = 0 OR {audience} = ANY(r.allowed_audiences))
        AND EXISTS (
            SELECT 1 FROM bailing_knowledge_client_allowed_routes cr
            WHERE cr.route_id = r.id AND cr.client_id = {client_id}
        )
        AND EXISTS (
            SELECT 1 FROM bailing_knowledge_agentsession_allowed_routes sr
            WHERE sr.route_id = r.id AND sr.agentsession_id = {session_id}
        )"""
ROUTE_ADMITS_PARAMETERS = ROUTE_ADMITS.format(
    audience="p_audience", client_id="p_client_id", session_id="p_session_id"
)
ROUTE_ADMITS_SESSION = ROUTE_ADMITS.format(
    audience="s.principal_audience", client_id="c.id", session_id="s.id"
)

# The route `r`'s knowledge bases in the model's default order (slug), as
# `route.knowledge_bases.all()` would list them; NULL for none.
ROUTE_KNOWLEDGE_BASES = f"""(
            SELECT json_agg({_object("kb", KNOWLEDGE_BASE)} ORDER BY kb.slug)
            FROM bailing_knowledge_route_knowledge_bases rk
            JOIN bailing_knowledge_knowledgebase kb ON kb.id = rk.knowledgebase_id
            WHERE rk.route_id = r.id
        )"""  # noqa: S608

# Each function returns one JSON object, or NULL when access is refused. One value rather
# than a row of typed columns: PostgreSQL builds no result set for the function, the client
# decodes one column instead of 35, and the call takes about 40% less time. Parameters are
# prefixed `p_` so that no name in a body can be read as a column. STABLE: they only read,
# within the calling statement's snapshot.
# One statement per item, as RunSQL then runs them (migration 0005 says why).
FUNCTIONS = [
    f"""
CREATE FUNCTION bailing_knowledge_live_session(p_token_hash text, p_now timestamptz)
RETURNS json LANGUAGE plpgsql STABLE AS $$
DECLARE
    access json;
BEGIN
    SELECT json_build_object(
        'session', {_object("s", SESSION)},
        'client', {_object("c", CLIENT)}
    ) INTO access
    FROM bailing_knowledge_agentsession s
    JOIN bailing_knowledge_client c ON c.id = s.client_id
    WHERE {SESSION_LIVE};
    RETURN access;
END $$
""",  # noqa: S608
    f"""
CREATE FUNCTION bailing_knowledge_admitted_route(
    p_route_key text, p_audience text, p_client_id bigint, p_session_id bigint
) RETURNS json LANGUAGE plpgsql STABLE AS $$
DECLARE
    access json;
BEGIN
    SELECT json_build_object(
        'route', {_object("r", ROUTE)},
        'knowledge_bases', {ROUTE_KNOWLEDGE_BASES}
    ) INTO access
    FROM bailing_knowledge_route r
    WHERE {ROUTE_ADMITS_PARAMETERS};
    RETURN access;
END $$
""",  # noqa: S608
    f"""
CREATE FUNCTION bailing_knowledge_live_session_and_route(
    p_token_hash text, p_now timestamptz, p_route_key text
) RETURNS json LANGUAGE plpgsql STABLE AS $$
DECLARE
    access json;
BEGIN
    -- The route is NULL when the session is live but the route refused.
    SELECT json_build_object(
        'session', {_object("s", SESSION)},
        'client', {_object("c", CLIENT)},
        'route', CASE WHEN r.id IS NOT NULL THEN {_object("r", ROUTE)} END,
        'knowledge_bases', {ROUTE_KNOWLEDGE_BASES}
    ) INTO access
    FROM bailing_knowledge_agentsession s
    JOIN bailing_knowledge_client c ON c.id = s.client_id
    LEFT JOIN bailing_knowledge_route r ON {ROUTE_ADMITS_SESSION}
    WHERE {SESSION_LIVE};
    RETURN access;
END $$
""",  # noqa: S608
]

DROP_FUNCTIONS = [
    "DROP FUNCTION IF EXISTS bailing_knowledge_live_session_and_route(text, timestamptz, text)",
    "DROP FUNCTION IF EXISTS bailing_knowledge_admitted_route(text, text, bigint, bigint)",
    "DROP FUNCTION IF EXISTS bailing_knowledge_live_session(text, timestamptz)",
]


class Migration(migrations.Migration):
    dependencies = [("bailing_knowledge", "0005_lexical_bm25")]

    operations = [migrations.RunSQL(FUNCTIONS, reverse_sql=DROP_FUNCTIONS)]
