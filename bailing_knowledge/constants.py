"""Protocol constants: wire names, limits and key labels that must never change per deployment."""

from typing import Final

PROTOCOL: Final = "bailing.agent-knowledge.v1"

SCHEMA_CAPABILITIES: Final = "bailing.agent-knowledge-capabilities.v1"
SCHEMA_SEARCH: Final = "bailing.agent-knowledge-search.v1"
SCHEMA_READ: Final = "bailing.agent-knowledge-read.v1"
SCHEMA_DELIVERY: Final = "bailing.agent-knowledge-delivery.v1"
SCHEMA_TURN_CONTEXT: Final = "bailing.agent-turn-context.v1"
SCHEMA_TASK_BINDING: Final = "bailing.agent-task-binding.v1"
SCHEMA_RUN_COMPLETION: Final = "bailing.agent-run-completion.v1"

TURN_MAX_INPUT_CHARS: Final = 64000
TURN_MAX_RENDERERS: Final = 20

TRUST_REFERENCE_ONLY: Final = "reference_only"
DELIVERY_MODES: Final = ("inline", "on_demand")
SEARCH_STATUSES: Final = ("ok", "disabled", "partial", "unavailable")
RUN_END_STATES: Final = ("completed", "failed", "cancelled")

SEARCH_MAX_RESULTS: Final = 3
SEARCH_MAX_BYTES: Final = 4096
SEARCH_MAX_QUERY_CHARS: Final = 2000
READ_DEFAULT_BYTES: Final = 16384
READ_MIN_BYTES: Final = 4096
READ_MAX_BYTES: Final = 32768
READ_CHAIN_MAX_BYTES: Final = 131072
REFERENCE_TTL_SECONDS: Final = 300
REFERENCE_MAX_FUTURE_SKEW_SECONDS: Final = 60

LIMITS: Final = {
    "search_max_results": SEARCH_MAX_RESULTS,
    "search_max_bytes": SEARCH_MAX_BYTES,
    "read_default_bytes": READ_DEFAULT_BYTES,
    "read_max_bytes": READ_MAX_BYTES,
    "reference_ttl_seconds": REFERENCE_TTL_SECONDS,
    "read_chain_max_bytes": READ_CHAIN_MAX_BYTES,
}

# Domain-separation labels for keys derived from SECRET_KEY: one label per use of HMAC.
SIGNING_LABEL_REFERENCE: Final = "bailing_knowledge.reference.v1"
SIGNING_LABEL_CURSOR: Final = "bailing_knowledge.cursor.v1"

# Bearer tokens: a recognisable prefix (secret scanners can match it) and 256 random bits.
ACCESS_TOKEN_PREFIX: Final = "bka_"  # noqa: S105 (a public prefix, not a secret)
ACCESS_TOKEN_BYTES: Final = 32

# Public identifiers carry a prefix so that logs and support tickets say what they are.
SESSION_ID_PREFIX: Final = "ses_"
RUN_ID_PREFIX: Final = "run_"
TASK_ID_PREFIX: Final = "task_"

# The default embedder's output size, whose HNSW index the vector leg names in its SQL.
INDEXED_EMBEDDING_DIMENSIONS: Final = 384
# The vector sizes the migrations give an HNSW index: the hashing embedder's and WordLlama's.
HNSW_EMBEDDING_DIMENSIONS: Final = (256, INDEXED_EMBEDDING_DIMENSIONS)
