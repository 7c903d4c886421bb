"""The per-alias registry: `get_embedder`, settings changes, bad entries, threads."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from bailing_knowledge.retrieval import embedders
from bailing_knowledge.retrieval.embedders import (
    BaseEmbedder,
    HashingEmbedder,
    OpenAIEmbedder,
    get_embedder,
)

HASHING = "bailing_knowledge.retrieval.embedders.HashingEmbedder"
OPENAI = "bailing_knowledge.retrieval.embedders.OpenAIEmbedder"


def embedders_setting(**entries: dict[str, Any]) -> dict[str, Any]:
    return {"EMBEDDERS": entries}


def test_get_embedder_builds_the_default_once(settings):
    settings.BAILING_KNOWLEDGE = {}
    embedder = get_embedder()
    assert isinstance(embedder, HashingEmbedder)
    assert embedder.alias == "default"
    assert get_embedder("default") is embedder


def test_get_embedder_rebuilds_when_the_setting_changes(settings):
    settings.BAILING_KNOWLEDGE = embedders_setting(default={"BACKEND": HASHING})
    before = get_embedder("default")
    settings.BAILING_KNOWLEDGE = embedders_setting(
        default={"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": 64}},
        other={"BACKEND": HASHING},
    )
    after = get_embedder("default")
    assert after is not before
    assert after.dimensions == 64
    assert get_embedder("other").dimensions == 384


def test_get_embedder_closes_dropped_instances(settings, server):
    settings.BAILING_KNOWLEDGE = embedders_setting(
        remote={"BACKEND": OPENAI, "OPTIONS": {"BASE_URL": server.base_url, "MODEL": "m"}}
    )
    remote = get_embedder("remote")
    assert isinstance(remote, OpenAIEmbedder)
    assert remote.embed_query("q")
    settings.BAILING_KNOWLEDGE = {}
    assert remote._client.is_closed


def test_get_embedder_names_an_unknown_alias(settings):
    settings.BAILING_KNOWLEDGE = embedders_setting(default={"BACKEND": HASHING})
    with pytest.raises(ImproperlyConfigured, match=r"Unknown embedder 'nope'.*'default'"):
        get_embedder("nope")


class NotAnEmbedder:
    pass


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"BACKEND": "no.such.Module"}, "cannot import"),
        ({"BACKEND": f"{__name__}.NotAnEmbedder"}, "BaseEmbedder subclass"),
        ({"OPTIONS": {}}, "'BACKEND' dotted path"),
        ({"BACKEND": HASHING, "OPTION": {}}, "unknown key"),
        ({"BACKEND": HASHING, "OPTIONS": ["DIMENSIONS"]}, "must be a dict"),
        ({"BACKEND": HASHING, "OPTIONS": {"DIMENSIONS": "x"}}, "DIMENSIONS"),
    ],
)
def test_get_embedder_rejects_bad_entries(settings, entry, message):
    settings.BAILING_KNOWLEDGE = embedders_setting(broken=entry)
    with pytest.raises(ImproperlyConfigured, match=message):
        get_embedder("broken")


def test_get_embedder_rejects_a_non_dict_setting(settings):
    settings.BAILING_KNOWLEDGE = {"EMBEDDERS": ["default"]}
    with pytest.raises(ImproperlyConfigured, match="must be a dict"):
        get_embedder("default")


def test_custom_backends_subclass_base_embedder():
    class Constant(BaseEmbedder):
        dimensions = 2
        model_name = "constant-v1"

        def embed_documents(self, texts):
            return [[1.0, 0.0] for _ in texts]

    embedder = Constant("c")
    assert embedder.embed_query("x") == [1.0, 0.0]
    assert "constant-v1" in repr(embedder)


def test_registry_is_thread_safe(settings):
    settings.BAILING_KNOWLEDGE = embedders_setting(default={"BACKEND": HASHING})
    results: list[BaseEmbedder] = []
    threads = [threading.Thread(target=lambda: results.append(get_embedder())) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(embedder) for embedder in results}) == 1
    assert embedders._embedders["default"] is results[0]
