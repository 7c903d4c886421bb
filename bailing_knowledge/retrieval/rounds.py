"""The lexical leg's statements: what a round asks PostgreSQL for, and in which words.

`lexical.LexicalLeg` decides what to read and when to stop; this module says how: which
lexemes a round wants (`levels_wanted`), the SQL of a round, of the closing round and of the
document checks, their parameters (`round_params`, the array literals), and how a round's
rows came (`Read`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from typing import Any

from ..models import KnowledgeBase
from .arrays import array_element, array_literal
from .bm25 import Scorer
from .postings import LEVELS, SEPARATOR, lexeme, quoted
from .statistics import Statistics
from .visibility import DOCUMENT_VISIBLE_SQL, OPEN_DOCUMENT_SQL

#: Lexemes one round asks for at most (the SQL stays small; the next round goes on), and
#: the chunk count under which a term is looked up once for all its levels (each lookup
#: costs, more so while the GIN index has entries pending). Up to about what a second round
#: reads: a rarer term is then read whole without holding up the others' levels; at 100k
#: NFCorpus chunks 300 instead of 1,000 took the median query from 773 chunks read in three
#: rounds to 500 in two.
ROUND_LEXEMES = 400
FEW = 300
#: Lexemes a first round asks for at most. With nothing read yet it wants every level of
#: every term, several hundred lexemes, but it reads only its first chunks (`lexical.
#: FIRST_ROUND`), from the heaviest few: over the NFCorpus test queries it had them by the
#: 13th lexeme at most at 1M chunks and by the 20th at 100k. Asking for fewer keeps its
#: plan, its parameters and the text PostgreSQL parses small; should they hold fewer chunks
#: than the round reads, it reads them all and the next round goes on from there.
FIRST_LEXEMES = 64


# Whether the document of chunk `c` lets it be seen (`_CHECKED`: or NULL when `check` is
# false, see `lexical.CHECKED_ROWS`). Scalar subqueries, a lookup by key per row, not
# EXISTS: the planner would hash EXISTS over every document of the database. A document open
# to everyone is found in the index of those alone (`OPEN_DOCUMENT_SQL`); only a chunk of
# another reads its document's row. At a million chunks, that took a first round of 200
# chunks from 2.86 to 2.59 ms of server time; what remains of its check is about 0.8 ms
# (docs/performance.md).
_VISIBLE_ROW = f"""coalesce(
           (SELECT true FROM bailing_knowledge_document d WHERE {OPEN_DOCUMENT_SQL}),
           (SELECT true FROM bailing_knowledge_document d WHERE {DOCUMENT_VISIBLE_SQL}),
           false)"""  # noqa: S608
_CHECKED = f"CASE WHEN %(check)s THEN {_VISIBLE_ROW} END"

# Each query term's count in chunk `c`, from its terms with positions: `'term':1A,2A ...`.
_COUNTS = "ts_filter(setweight(c.lexical_terms, 'A', %(terms)s::text[]), '{a}')::text"


def _round(counts: str, columns: str = "") -> str:
    """A round's statement returning `counts` as each row's third column; `columns` are
    further columns of the chunk that `counts` reads."""
    # Each level is looked up in the GIN index on its own (a lateral join over the lexemes
    # wanted): the planner cannot mistake a round for a scan of the table, however common
    # its terms. A chunk found through two terms comes twice (the caller keeps one). The KB
    # filter is here; the document's state and audience are checked before a chunk counts
    # (`_CHECKED`, the last column, or `VISIBLE` for the leaders).
    return f"""/* bk:lexical */
SELECT c.id, c.lexical_length,
       {counts}, w.position,
       c.document_id, c.revision, {_CHECKED}
FROM unnest(%(wanted)s::text[]) WITH ORDINALITY AS w(lexeme, position)
CROSS JOIN LATERAL (
    SELECT c.id, c.document_id, c.revision, c.lexical_length, c.lexical_terms{columns}
    FROM bailing_knowledge_chunk c
    WHERE c.search_vector @@ w.lexeme::tsquery
      -- Written so that no index serves it: the GIN index must (see above).
      AND c.knowledge_base_id + 0 = ANY(%(kbs)s::bigint[])
      AND c.id <> ALL(%(seen)s::bigint[])
) c
LIMIT %(budget)s
"""  # noqa: S608


ROUND = _round(_COUNTS)


@lru_cache(maxsize=64)
def gated_round(terms: int) -> str:
    """A round that returns the term counts only of the chunks that may still reach the
    leaders (`round_statement`), for `terms` query terms with unread levels.

    A chunk's bound is the bound of the level it was found at (`own`, by the lexeme's place,
    minus its term's `reach`) plus the `reach` of every such term it holds: whether it holds
    one is a match of the term's prefix against `search_vector`, a lookup in the vector,
    where the counts copy the whole of `lexical_terms` twice."""
    held = "\n         + ".join(
        f"CASE WHEN c.search_vector @@ %(held_{i})s::tsquery THEN %(reach_{i})s::float8 ELSE 0 END"
        for i in range(terms)
    )
    bound = f"(%(own)s::float8[])[w.position] + {held}" if terms else "0"
    return _round(f"CASE WHEN {bound} >= %(gate)s::float8 THEN {_COUNTS} END", ", c.search_vector")


# The closing round: every unread chunk holding one of the combinations of terms that could
# still reach the proven ranks (`bm25.reaching_combinations`), as one tsquery of ANDs under an OR.
# It reads few (`lexical.CHECKED_ROWS`) and checks each one's document before the LIMIT: a
# hidden chunk takes none of the budget.
COMBINED = f"""/* bk:lexical */
SELECT c.id, c.lexical_length,
       ts_filter(setweight(c.lexical_terms, 'A', %(terms)s::text[]), '{{a}}')::text, 0,
       c.document_id, c.revision, true
FROM bailing_knowledge_chunk c
WHERE c.search_vector @@ %(combined)s::tsquery
  AND c.knowledge_base_id + 0 = ANY(%(kbs)s::bigint[])
  AND c.id <> ALL(%(seen)s::bigint[])
  AND {_VISIBLE_ROW}
LIMIT %(budget)s
"""  # noqa: S608

# How many chunks of every knowledge base hold the terms: what the GIN index's lists hold.
ALL_POSTINGS = f"""/* bk:lexicon */
SELECT coalesce(sum(l.chunks), 0)
FROM {KnowledgeBase._meta.db_table} k
JOIN bailing_knowledge_lexicon l ON l.knowledge_base_id = k.id AND l.term = ANY(%(terms)s::text[])
"""  # noqa: S608

# SQL from module constants only; values go in as parameters.
VISIBLE = f"""/* bk:lexical */
SELECT c.id FROM bailing_knowledge_chunk c, bailing_knowledge_document d
WHERE c.id = ANY(%(ids)s::bigint[]) AND {DOCUMENT_VISIBLE_SQL}
"""  # noqa: S608

# The documents, of those asked for, that admit the principal, and their revisions: whose
# chunks are visible (`LexicalLeg.verification`). A function of migration 0011, whose plan
# the connection keeps: planning the same query sent alone cost more than running it.
ADMITTED = """/* bk:lexical */
SELECT * FROM bailing_knowledge_admitted_documents(
    %(ids)s::bigint[], %(audience)s::text, %(roles)s::text[]
)
"""

# The reference: every chunk holding a query term, visible ones only.
EVERY = f"""/* bk:lexical */
SELECT c.id, c.lexical_length,
       ts_filter(setweight(c.lexical_terms, 'A', %(terms)s::text[]), '{{a}}')::text
FROM bailing_knowledge_chunk c, bailing_knowledge_document d
WHERE c.search_vector @@ %(tsquery)s::tsquery AND c.knowledge_base_id = ANY(%(kbs)s::bigint[])
  AND {DOCUMENT_VISIBLE_SQL}
"""  # noqa: S608


def levels_wanted(
    scorer: Scorer,
    stats: Statistics,
    frontier: dict[str, int],
    floor: float,
    limit: int = ROUND_LEXEMES,
) -> list[tuple[float, str, int]]:
    """The `limit` first of every unread level whose bound reaches `floor`, heaviest bound
    first (ties in the order of the terms, then of the levels): a round reads them in that
    order until its size is reached. A term found in few chunks is one lookup for all its
    levels (value -1)."""
    levels: list[tuple[float, str, int]] = []
    for term, highest in frontier.items():
        if highest < 0:
            continue
        bounds = scorer.bounds(term)
        if stats.df[term] <= FEW:
            if bounds[highest] >= floor:
                levels.append((bounds[highest], term, -1))
            continue
        # A term's bounds never fall with its level (`Scorer.bounds`): the levels that reach
        # `floor` are those from the first that does up to `highest`.
        # No more than `limit` of them: a term's later levels sort after its own earlier ones.
        lowest = max(bisect_left(bounds, floor, 0, highest + 1), highest + 1 - limit)
        if lowest <= highest:
            stop = lowest - 1 if lowest else None
            levels += zip(bounds[highest:stop:-1], repeat(term), range(highest, lowest - 1, -1))
    # Stable, as is `reverse`: ties keep the order they were listed in.
    levels.sort(key=itemgetter(0), reverse=True)
    return levels[:limit]


@dataclass
class Read:
    """What a round's statement returned: its rows, the position (in the lexemes asked for) of
    the last one, and whether positions came in order."""

    rows: int = 0
    last: int = 0
    in_order: bool = True


def round_params(
    params: dict[str, Any],
    wanted: list[tuple[float, str, int]],
    seen: str,
    size: int,
    check: bool,
) -> dict[str, Any]:
    """The parameters of a round (`ROUND`) reading `wanted` in order, up to `size` chunks
    not in `seen` (an `id_array`), checking each one's document if `check`. The lexemes go
    as one `text[]` literal: one string for the driver to quote instead of up to
    `ROUND_LEXEMES` elements, each escaped once per process (`_wanted_elements`)."""
    return {
        **params,
        "wanted": array_literal([_wanted_elements(term)[value] for _, term, value in wanted]),
        "seen": seen,
        "budget": size,
        "check": check,
    }


def round_statement(
    params: dict[str, Any],
    wanted: list[tuple[float, str, int]],
    seen: str,
    size: int,
    check: bool,
    reach: dict[str, float],
    gate: float,
) -> tuple[str, dict[str, Any]]:
    """A round (`round_params`) whose rows carry term counts only for the chunks whose
    bound reaches `gate` (`gated_round`); every chunk's when `gate` is 0. `reach`: for each
    term with unread levels, the bound of the highest one, the most a chunk not read yet can
    score for it; the level a row was found at bounds its own term more tightly.

    A caller whose `gate` is the score a chunk must beat to join its leaders needs no other
    chunk's counts: they score less, whatever they hold."""
    values = round_params(params, wanted, seen, size, check)
    if gate <= 0:
        return ROUND, values
    values["own"] = array_literal(repr(bound - reach[term]) for bound, term, _ in wanted)
    values["gate"] = gate
    for i, (term, bound) in enumerate(reach.items()):
        values[f"held_{i}"] = level_query(term, -1)
        values[f"reach_{i}"] = bound
    return gated_round(len(reach)), values


def in_order(rows: Sequence[tuple[Any, ...]]) -> bool:
    """Rows came level by level, in the order asked (the plan's nested loop keeps it)."""
    positions = [row[3] for row in rows]
    return positions == sorted(positions)  # sorting a sorted list is one pass, in C


@lru_cache(maxsize=8192)
def _wanted_elements(term: str) -> tuple[str, ...]:
    """`level_query` of each level of `term` as an array element, escaped once, by level;
    the last is that of all its levels (`value` -1)."""
    query = level_query.__wrapped__  # not through its cache: these are kept here
    return tuple(array_element(query(term, value)) for value in [*range(LEVELS), -1])


@lru_cache(maxsize=65536)
def level_query(term: str, value: int) -> str:
    """The tsquery of one level of a term, or of all its levels (`value` -1)."""
    if value < 0:
        return quoted(term + SEPARATOR) + ":*"
    return quoted(lexeme(term, value))
