"""`knowledge_base create|list|enable|disable|set-language|reindex-lexical|languages`."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import override_settings

from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.models import KnowledgeBase
from tests.management import run, run_json

pytestmark = pytest.mark.django_db


def test_create_with_every_option():
    data = run_json(
        "knowledge_base",
        "create",
        "policies",
        "--title",
        "Policies",
        "--description",
        "Company policies",
        "--tenant",
        "acme",
        "--language",
        "german",
        "--disabled",
    )
    assert data["slug"] == "policies"
    assert data["title"] == "Policies"
    assert data["enabled"] is False
    assert data["language"] == "german"
    assert data["routes"] == []
    kb = KnowledgeBase.objects.get(slug="policies")
    assert (kb.title, kb.description, kb.tenant, kb.embedder, kb.enabled, kb.language) == (
        "Policies",
        "Company policies",
        "acme",
        "default",
        False,
        "german",
    )


def test_create_text_output_and_defaults():
    out = run("knowledge_base", "create", "faq")
    assert "Created knowledge base faq." in out
    assert "language     english" in out
    kb = KnowledgeBase.objects.get(slug="faq")
    assert kb.title == "faq"
    assert kb.enabled is True
    assert kb.language == "english"


@override_settings(
    BAILING_KNOWLEDGE={
        "EMBEDDERS": {
            "default": {"BACKEND": "x.Default"},
            "multilingual": {"BACKEND": "x.Multilingual"},
        }
    }
)
def test_create_with_a_configured_embedder():
    data = run_json("knowledge_base", "create", "docs", "--embedder", "multilingual")
    assert data["embedder"] == "multilingual"
    assert KnowledgeBase.objects.get(slug="docs").embedder == "multilingual"


def test_create_rejects_an_unknown_embedder():
    with pytest.raises(CommandError, match=r"--embedder: Unknown embedder 'nope'"):
        run("knowledge_base", "create", "docs", "--embedder", "nope")
    assert not KnowledgeBase.objects.filter(slug="docs").exists()


def test_create_rejects_an_unknown_language():
    with pytest.raises(CommandError, match=r"--language: Unknown language 'klingon' \(supported: "):
        run("knowledge_base", "create", "docs", "--language", "klingon")
    assert not KnowledgeBase.objects.filter(slug="docs").exists()


def test_create_rejects_a_duplicate_slug(kb):
    with pytest.raises(CommandError, match=r"SLUG: .*already exists"):
        run("knowledge_base", "create", kb.slug)
    assert KnowledgeBase.objects.count() == 1


def test_create_rejects_an_invalid_slug():
    with pytest.raises(CommandError, match="SLUG: Enter a valid"):
        run("knowledge_base", "create", "not a slug!")
    assert not KnowledgeBase.objects.exists()


def test_an_overlong_slug_is_reported_against_the_slug_alone():
    # The title falls back to the slug: it must not be blamed for the slug's length.
    with pytest.raises(CommandError) as caught:
        run("knowledge_base", "create", "k" * 500)
    assert "SLUG: Ensure this value has at most 64 characters" in str(caught.value)
    assert "--title" not in str(caught.value)
    assert not KnowledgeBase.objects.exists()


def test_create_requires_a_slug():
    with pytest.raises(CommandError, match="required"):
        run("knowledge_base", "create")


def test_a_subcommand_is_required():
    with pytest.raises(CommandError, match="required"):
        run("knowledge_base")


def test_list(kb, route):
    run("knowledge_base", "create", "archive", "--disabled")
    data = run_json("knowledge_base", "list")
    assert [item["slug"] for item in data] == ["archive", "handbook"]
    assert data[0]["enabled"] is False
    assert data[1]["routes"] == [route.route_key]
    assert data[1]["language"] == "english"

    out = run("knowledge_base", "list")
    assert out.splitlines()[0].split() == [
        "SLUG",
        "TITLE",
        "ENABLED",
        "EMBEDDER",
        "LANGUAGE",
        "TENANT",
        "ROUTES",
    ]
    assert "handbook" in out
    assert "orders" in out


def test_list_empty(db):
    assert run_json("knowledge_base", "list") == []
    assert "No knowledge bases." in run("knowledge_base", "list")


def test_disable_and_enable(kb):
    data = run_json("knowledge_base", "disable", kb.slug)
    assert data["enabled"] is False
    kb.refresh_from_db()
    assert kb.enabled is False

    out = run("knowledge_base", "enable", kb.slug)
    assert f"Knowledge base {kb.slug} enabled." in out
    kb.refresh_from_db()
    assert kb.enabled is True


@pytest.mark.parametrize("subcommand", ["enable", "disable"])
def test_toggle_rejects_an_unknown_slug(db, subcommand):
    with pytest.raises(CommandError, match="No knowledge base with slug 'missing'"):
        run("knowledge_base", subcommand, "missing")


def indexed_terms(kb):
    """The terms of the KB's lexical index (each lexeme is "<term>" or "<term>|<suffix>")."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT v.lexeme FROM bailing_knowledge_chunk c, unnest(c.search_vector) v"
            " WHERE c.knowledge_base_id = %s",
            [kb.pk],
        )
        return {lexeme.split("|")[0] for (lexeme,) in cursor.fetchall()}


def test_set_language_re_indexes_the_documents(kb):
    upsert_document(kb, "a.md", "Notes", "Die Häuser stehen am Wasser.")
    assert "häuser" in indexed_terms(kb)

    data = run_json("knowledge_base", "set-language", kb.slug, "german")
    assert (data["slug"], data["language"]) == (kb.slug, "german")
    kb.refresh_from_db()
    assert kb.language == "german"
    terms = indexed_terms(kb)
    assert "haus" in terms
    assert "häuser" not in terms

    out = run("knowledge_base", "set-language", kb.slug, "simple")
    assert f"Knowledge base {kb.slug} now uses the language 'simple'" in out
    assert "häuser" in indexed_terms(kb)
    out = run("knowledge_base", "set-language", kb.slug, "simple")
    assert f"Knowledge base {kb.slug} already uses the language 'simple'." in out


def test_set_language_rejects_an_unknown_language(kb):
    with pytest.raises(CommandError, match=r"^CODE: Unknown language 'klingon'"):
        run("knowledge_base", "set-language", kb.slug, "klingon")
    kb.refresh_from_db()
    assert kb.language == "english"


def test_set_language_rejects_an_unknown_slug(db):
    with pytest.raises(CommandError, match="No knowledge base with slug 'missing'"):
        run("knowledge_base", "set-language", "missing", "german")


def test_reindex_lexical_recounts_a_kbs_statistics(kb):
    from bailing_knowledge.models import LexiconTerm

    upsert_document(kb, "a.md", "Notes", "Refunds are paid within thirty days.")
    before = {(t.term, t.chunks) for t in LexiconTerm.objects.filter(knowledge_base=kb)}
    LexiconTerm.objects.filter(knowledge_base=kb).delete()
    data = run_json("knowledge_base", "reindex-lexical", kb.slug)
    assert (data["slug"], data["chunks"]) == (kb.slug, 1)
    assert {(t.term, t.chunks) for t in LexiconTerm.objects.filter(knowledge_base=kb)} == before
    out = run("knowledge_base", "reindex-lexical", kb.slug)
    assert f"Re-indexed the lexical terms of 1 chunks of {kb.slug}." in out
    with pytest.raises(CommandError, match="No knowledge base with slug 'missing'"):
        run("knowledge_base", "reindex-lexical", "missing")


def test_languages_lists_the_codes_and_labels(db):
    data = run_json("knowledge_base", "languages")
    assert {"code": "german", "label": "German"} in data
    assert {"code": "simple", "label": "No stemming or stopwords"} in data
    assert "porter" not in {item["code"] for item in data}

    out = run("knowledge_base", "languages")
    assert out.splitlines()[0].split() == ["CODE", "LANGUAGE"]
    assert ["english", "English"] in [line.split() for line in out.splitlines()]


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        (("knowledge_base", "create"), "SLUG"),
        (("knowledge_base", "set-language"), "SLUG CODE"),
        (("knowledge_route", "update"), "ROUTE_KEY"),
        (("agent_client", "enable"), "APP_ID"),
        (("agent_session", "revoke"), "SESSION_ID"),
        (("agent_task", "add-member"), "TASK_ID SESSION_ID [SESSION_ID ...]"),
        (("knowledge_ingest",), "KB PATH [PATH ...]"),
    ],
)
def test_usage_lines_name_positional_arguments_as_the_docs_and_errors_do(command, usage, capsys):
    with pytest.raises(SystemExit):
        call_command(*command, "--help")
    assert capsys.readouterr().out.split("\n\n")[0].rstrip().endswith(usage)
