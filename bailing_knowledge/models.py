"""The data model: who may call (clients, sessions, routes) and what they may read (KBs, chunks)."""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from typing import Any

from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex, OpClass
from django.contrib.postgres.search import SearchVectorField
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, router, transaction
from django.db.models import Q
from django.db.models.functions import Cast
from django.utils import timezone
from pgvector.django import HalfVectorField, HnswIndex, VectorField

from . import constants
from .database import hnsw_parameters
from .locks import share_write_lock
from .prefetch import prefetched_list


def _public_id(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(16)


def new_session_id() -> str:
    return _public_id(constants.SESSION_ID_PREFIX)


def new_run_id() -> str:
    return _public_id(constants.RUN_ID_PREFIX)


def new_task_id() -> str:
    return _public_id(constants.TASK_ID_PREFIX)


def hash_token(token: str) -> str:
    """Return the SHA-256 hex digest under which a bearer token is stored and looked up."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def content_hash(title: str, body: str) -> str:
    """SHA-256 of a document's title and body, length-prefixed so that no two pairs collide."""
    digest = hashlib.sha256()
    for part in (title, body):
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def _choices_check(
    field: str, choices: type[models.TextChoices], name: str
) -> models.CheckConstraint:
    return models.CheckConstraint(condition=Q(**{f"{field}__in": choices.values}), name=name)


class KnowledgeMode(models.TextChoices):
    CHUNK = "chunk", "Chunk"
    DOCUMENT = "document", "Whole document"


class DocumentStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    INDEXING = "indexing", "Indexing"
    READY = "ready", "Ready"
    FAILED = "failed", "Failed"


class TaskState(models.TextChoices):
    ACTIVE = "active", "Active"
    PAUSED = "paused", "Paused"
    CANCELLED = "cancelled", "Cancelled"


class RunState(models.TextChoices):
    PREPARING = "preparing", "Preparing"
    CONTEXT_READY = "context_ready", "Context ready"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class DeliveryMode(models.TextChoices):
    LEGACY = "legacy", "Legacy (inline, not negotiated)"
    INLINE = "inline", "Inline"
    ON_DEMAND = "on_demand", "On demand"


def _lock_knowledge_bases(rows: models.QuerySet, using: str) -> None:
    """Before deleting knowledge bases: their rows, then their write locks, in the order of
    `locks`, so that deleting one while its language changes cannot deadlock."""
    ids = list(rows.order_by("pk").select_for_update().values_list("pk", flat=True))
    share_write_lock(ids, using)


class KnowledgeBaseQuerySet(models.QuerySet):
    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete with the locks in their order (`_lock_knowledge_bases`)."""
        with transaction.atomic(using=self.db):
            rows = self.model._base_manager.using(self.db).filter(pk__in=self.values("pk"))
            _lock_knowledge_bases(rows, self.db)
            return super().delete()

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]


class KnowledgeBase(models.Model):
    """A named set of documents that routes expose; admins toggle it with `enabled`."""

    slug = models.SlugField(max_length=64, unique=True)
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    embedder = models.CharField(
        max_length=64,
        default="default",
        help_text="Alias of an embedder in BAILING_KNOWLEDGE['EMBEDDERS'].",
    )
    tenant = models.CharField(
        max_length=128,
        blank=True,
        help_text="When set, only sessions whose principal belongs to this tenant see the KB.",
    )
    language = models.CharField(
        max_length=32,
        default="english",
        help_text=(
            "Language of the documents' text: its stemmer and stopwords shape lexical search "
            "(Chinese and Japanese are indexed as character pairs whatever the language)."
        ),
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = KnowledgeBaseQuerySet.as_manager()

    class Meta:
        ordering = ["slug"]
        verbose_name = "knowledge base"

    def __str__(self) -> str:
        return self.slug

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict]:
        """Deleted as `KnowledgeBaseQuerySet.delete` deletes (`_lock_knowledge_bases`)."""
        using = using or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using):
            _lock_knowledge_bases(type(self)._base_manager.using(using).filter(pk=self.pk), using)
            return super().delete(using, keep_parents)


class Route(models.Model):
    """A workspace agents address by `route_key`, with its knowledge settings."""

    Mode = KnowledgeMode

    route_key = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, blank=True)
    enabled = models.BooleanField(default=True)
    allowed_audiences = ArrayField(
        models.CharField(max_length=64),
        default=list,
        blank=True,
        help_text="Principal audiences admitted to this route; empty admits every audience.",
    )
    agent_client_enabled = models.BooleanField(
        default=True,
        verbose_name="agent client runtime enabled",
        help_text="The route's switch for the Agent Client runtime (agent_client.enabled).",
    )
    knowledge_enabled = models.BooleanField(default=True)
    knowledge_bases = models.ManyToManyField(KnowledgeBase, related_name="routes", blank=True)
    top_k = models.PositiveSmallIntegerField(
        default=5, validators=[MinValueValidator(1), MaxValueValidator(50)]
    )
    min_score = models.FloatField(
        default=0.0, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)]
    )
    max_docs = models.PositiveSmallIntegerField(
        default=3, validators=[MinValueValidator(1), MaxValueValidator(20)]
    )
    knowledge_mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.CHUNK)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["route_key"]
        constraints = [
            models.CheckConstraint(
                condition=Q(top_k__gte=1, top_k__lte=50), name="bk_route_top_k_range"
            ),
            models.CheckConstraint(
                condition=Q(max_docs__gte=1, max_docs__lte=20), name="bk_route_max_docs_range"
            ),
            models.CheckConstraint(
                condition=Q(min_score__gte=0.0, min_score__lte=1.0),
                name="bk_route_min_score_range",
            ),
            _choices_check("knowledge_mode", KnowledgeMode, "bk_route_knowledge_mode_valid"),
        ]

    def __str__(self) -> str:
        return self.route_key

    def clean(self) -> None:
        if not math.isfinite(self.min_score):
            raise ValidationError({"min_score": "Must be a finite number between 0 and 1."})

    def admits_audience(self, audience: str) -> bool:
        """Whether principals of `audience` may use the route (the request's check, in SQL,
        is `bailing_knowledge_live_session_and_route`)."""
        return not self.allowed_audiences or audience in self.allowed_audiences

    def bound_knowledge_bases(self) -> list[KnowledgeBase]:
        """The route's knowledge bases, by slug: what `knowledge_bases.all()` lists, read
        from the prefetched ones where there are (as on every agent request) without the
        related manager that each `knowledge_bases` access builds."""
        listed = prefetched_list(self, "knowledge_bases")
        return listed if listed is not None else list(self.knowledge_bases.all())

    def knowledge_configuration(self) -> dict[str, Any]:
        """The inputs of `knowledge_scope_revision`: KB set and state, retrieval settings."""
        kbs = sorted(self.bound_knowledge_bases(), key=lambda kb: kb.pk)
        return {
            "enabled": self.knowledge_enabled,
            "top_k": self.top_k,
            "min_score": float(self.min_score),
            "max_docs": self.max_docs,
            "mode": self.knowledge_mode,
            "knowledge_bases": [[kb.pk, kb.slug, kb.enabled, kb.embedder, kb.tenant] for kb in kbs],
        }

    @property
    def knowledge_scope_revision(self) -> str:
        """A stable hash that changes exactly when the knowledge configuration changes."""
        canonical = json.dumps(
            self.knowledge_configuration(), sort_keys=True, separators=(",", ":")
        )
        return "ksr_" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]


class Client(models.Model):
    """A registered agent application, identified by its public `app_id`."""

    app_id = models.SlugField(max_length=100, unique=True)
    name = models.CharField(max_length=200, blank=True)
    enabled = models.BooleanField(default=True)
    allowed_routes = models.ManyToManyField(Route, related_name="clients", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["app_id"]
        verbose_name = "agent client"

    def __str__(self) -> str:
        return self.app_id


class AgentSessionQuerySet(models.QuerySet):
    """Sessions by status: the one definition of active, expired and revoked in a query.

    `now` is a datetime or a database expression (`Now()`); by default the current time.
    A session is active until it is revoked or reaches `expires_at`; revoked wins over
    expired. `AgentSession.status_at` is the same rule for one loaded row.
    """

    def active(self, now: Any = None) -> AgentSessionQuerySet:
        return self.filter(revoked_at__isnull=True, expires_at__gt=_now(now))

    def inactive(self, now: Any = None) -> AgentSessionQuerySet:
        return self.exclude(revoked_at__isnull=True, expires_at__gt=_now(now))

    def expired(self, now: Any = None) -> AgentSessionQuerySet:
        return self.filter(revoked_at__isnull=True, expires_at__lte=_now(now))

    def revoked(self) -> AgentSessionQuerySet:
        return self.filter(revoked_at__isnull=False)


def _now(now: Any) -> Any:
    return timezone.now() if now is None else now


class AgentSession(models.Model):
    """One authorization of a client for one business principal, reached by a bearer token.

    The token itself is never stored: only its SHA-256 (`token_hash`) and a short,
    non-secret `token_hint` that helps an admin tell sessions apart.
    """

    session_id = models.CharField(
        max_length=64, unique=True, default=new_session_id, editable=False
    )
    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="sessions")
    principal_id = models.CharField(max_length=200)
    principal_tenant = models.CharField(max_length=128, blank=True)
    principal_roles = ArrayField(models.CharField(max_length=64), default=list, blank=True)
    principal_audience = models.CharField(max_length=64, blank=True)
    on_behalf_of = models.CharField(max_length=200, blank=True)
    allowed_routes = models.ManyToManyField(Route, related_name="agent_sessions", blank=True)
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    token_hint = models.CharField(max_length=16, editable=False)
    device_label = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = AgentSessionQuerySet.as_manager()

    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        EXPIRED = "expired", "Expired"
        REVOKED = "revoked", "Revoked"

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "agent session"
        indexes = [models.Index(fields=["client", "principal_id"], name="bk_session_principal")]
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gt=models.F("created_at")),
                name="bk_session_expires_after_created",
            ),
            models.CheckConstraint(
                condition=Q(token_hash__regex=r"^[0-9a-f]{64}$"),  # noqa: S106
                name="bk_session_token_hash_sha256",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.session_id} ({self.principal_id})"

    @property
    def principal(self) -> dict[str, Any]:
        return {
            "id": self.principal_id,
            "tenant": self.principal_tenant,
            "roles": list(self.principal_roles),
            "audience": self.principal_audience,
        }

    def status_at(self, now: Any = None) -> str:
        """`Status` of this session at `now` (default: the current time)."""
        if self.revoked_at is not None:
            return self.Status.REVOKED.value
        active = self.expires_at > _now(now)
        return (self.Status.ACTIVE if active else self.Status.EXPIRED).value

    @property
    def status(self) -> str:
        return self.status_at()

    def is_active(self, now: Any = None) -> bool:
        return self.status_at(now) == self.Status.ACTIVE


def _lock_documents(documents: models.QuerySet, using: str) -> list[int]:
    """Before deleting `documents`: their knowledge bases' write locks, then their own rows,
    in the order writers lock them (`locks`), so that no writer adds chunks to one of them,
    nor holds one, while its chunks and then itself are deleted. Returns the rows locked."""
    kb_ids = set(documents.values_list("knowledge_base_id", flat=True))
    share_write_lock(kb_ids, using)
    rows = documents.filter(knowledge_base_id__in=kb_ids)
    return list(
        rows.order_by("knowledge_base_id", "source_key")
        .select_for_update()
        .values_list("pk", flat=True)
    )


class DocumentQuerySet(models.QuerySet):
    def delete(self) -> tuple[int, dict[str, int]]:
        """Delete with the locks in their order (`_lock_documents`): the admin's delete
        action among others."""
        with transaction.atomic(using=self.db):
            documents = self.model._base_manager.using(self.db)
            locked = _lock_documents(documents.filter(pk__in=self.values("pk")), self.db)
            # Those rows only: one that started to match meanwhile was not locked in order.
            return super(DocumentQuerySet, self.filter(pk__in=locked)).delete()

    delete.alters_data = True  # type: ignore[attr-defined]
    delete.queryset_only = True  # type: ignore[attr-defined]


class Document(models.Model):
    """A source text in a KB; `revision` grows on every change of title or body."""

    Status = DocumentStatus

    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="documents"
    )
    source_key = models.CharField(max_length=512)
    title = models.CharField(max_length=500)
    body = models.TextField()
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    revision = models.PositiveIntegerField(default=1)
    content_hash = models.CharField(max_length=64)
    last_error = models.TextField(blank=True)
    # When a re-index was queued, until its task has run: a `ready` document keeps serving
    # its chunks meanwhile, so its status cannot show the waiting work (docs/ingestion.md).
    reindex_queued_at = models.DateTimeField(
        "re-index queued at", null=True, blank=True, editable=False
    )
    # The content a document was last asked to take, once an edit has been queued for it: a
    # queued task whose content it does not name was overtaken by newer content (the served
    # one again included) and gives way. Empty: no edit queued yet (docs/ingestion.md).
    queued_hash = models.CharField(max_length=64, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = DocumentQuerySet.as_manager()

    class Meta:
        ordering = ["knowledge_base", "source_key"]
        constraints = [
            models.UniqueConstraint(
                fields=["knowledge_base", "source_key"], name="bk_document_kb_source_key_unique"
            ),
            _choices_check("status", DocumentStatus, "bk_document_status_valid"),
            models.CheckConstraint(condition=Q(revision__gte=1), name="bk_document_revision_gte_1"),
        ]
        indexes = [
            # The documents everyone may see, by id and revision: the lexical leg checks the
            # document of each chunk it reads, and for these the index alone answers
            # (`visibility.OPEN_DOCUMENT_SQL`, an index-only scan), without the row.
            models.Index(
                fields=["id", "revision"],
                name="bk_document_open",
                condition=Q(status=DocumentStatus.READY)
                & ~Q(metadata__has_key="audiences")
                & ~Q(metadata__has_key="roles"),
            ),
        ]

    def __str__(self) -> str:
        return self.source_key

    def delete(self, using: str | None = None, keep_parents: bool = False) -> tuple[int, dict]:
        """Deleted as `DocumentQuerySet.delete` deletes (`_lock_documents`)."""
        using = using or router.db_for_write(type(self), instance=self)
        with transaction.atomic(using=using):
            _lock_documents(type(self)._base_manager.using(using).filter(pk=self.pk), using)
            return super().delete(using, keep_parents)


def vector_index(dimensions: int) -> HnswIndex:
    """The partial HNSW index over the chunks of one vector size.

    Half precision: at 100k chunks of 384 dimensions, with the sparser graph of that size
    (`database.hnsw_parameters`), the database's cost of inserting a chunk fell from 3.9 ms
    (full precision, m 16, ef_construction 64) to 1.6 ms, and a higher `SEARCH_EF_SEARCH`
    (128) keeps recall and query latency about where they were (docs/performance.md).
    Searches order by this exact expression but return full-precision distances.
    """
    m, ef_construction = hnsw_parameters(dimensions)
    return HnswIndex(
        OpClass(
            Cast("embedding", HalfVectorField(dimensions=dimensions)),
            name="halfvec_cosine_ops",
        ),
        name=f"bk_chunk_embedding_hnsw_{dimensions}",
        m=m,
        ef_construction=ef_construction,
        condition=Q(embedding_dimensions=dimensions),
    )


class Chunk(models.Model):
    """A piece of one document revision, with its vector and lexical index entries.

    `text == document.body[start:end]` for the revision the chunk was cut from.
    """

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks")
    knowledge_base = models.ForeignKey(
        KnowledgeBase, on_delete=models.CASCADE, related_name="chunks"
    )
    revision = models.PositiveIntegerField()
    ordinal = models.PositiveIntegerField()
    start = models.PositiveIntegerField()
    end = models.PositiveIntegerField()
    text = models.TextField()
    text_hash = models.CharField(max_length=64)
    embedding = VectorField(null=True, blank=True, editable=False)
    embedding_dimensions = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # Lexemes `<term>|<level>` (GIN-indexed), each term with positions 1..tf, and the number
    # of terms the chunk is indexed under (BM25's document length): retrieval/lexical.py.
    search_vector = SearchVectorField(null=True, editable=False)
    lexical_terms = SearchVectorField(null=True, editable=False)
    lexical_length = models.PositiveIntegerField(default=0, db_default=0, editable=False)

    class Meta:
        ordering = ["document", "revision", "ordinal"]
        indexes = [
            models.Index(fields=["document", "revision"], name="bk_chunk_doc_revision"),
            # One HNSW index per shipped embedder size (hashing 384, WordLlama 256); other
            # sizes get theirs from `manage.py knowledge_vector_index`.
            *(vector_index(size) for size in constants.HNSW_EMBEDDING_DIMENSIONS),
            # Rows written go to the index's pending list first, which every lookup scans;
            # a small list keeps searches after an ingestion as fast as before it
            # (migration 0007).
            GinIndex(
                fields=["search_vector"],
                name="bk_chunk_search_vector_gin",
                gin_pending_list_limit=128,  # kB
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["document", "revision", "ordinal"], name="bk_chunk_position_unique"
            ),
            models.CheckConstraint(
                condition=Q(end__gte=models.F("start")), name="bk_chunk_span_valid"
            ),
            models.CheckConstraint(
                condition=Q(embedding__isnull=True) | Q(embedding_dimensions__isnull=False),
                name="bk_chunk_embedding_dimensions_set",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.document_id}@{self.revision}#{self.ordinal}"


class LexiconTerm(models.Model):
    """How many chunks of a KB hold a term, and in total how often: BM25's statistics.

    The row with the empty term holds the KB's totals (chunks, and terms over all chunks).
    Triggers on the chunk table keep the counts exact as chunks are written and deleted;
    `top` is the highest level a posting of the term has had (an upper bound, never
    lowered), where a search starts reading.
    """

    pk = models.CompositePrimaryKey("knowledge_base", "term")
    knowledge_base = models.ForeignKey(KnowledgeBase, on_delete=models.CASCADE, related_name="+")
    term = models.CharField(max_length=80, blank=True)
    chunks = models.BigIntegerField(default=0)
    length = models.BigIntegerField(default=0)
    top = models.SmallIntegerField(default=0)

    class Meta:
        db_table = "bailing_knowledge_lexicon"
        verbose_name = "lexicon term"

    def __str__(self) -> str:
        return f"{self.knowledge_base_id}:{self.term or '(totals)'}"


class Task(models.Model):
    """An admin-managed task; runs bound to it follow its state on every call."""

    State = TaskState

    task_id = models.CharField(max_length=64, unique=True, default=new_task_id, editable=False)
    title = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=State.choices, default=State.ACTIVE)
    members = models.ManyToManyField(AgentSession, related_name="tasks", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [_choices_check("state", TaskState, "bk_task_state_valid")]

    def __str__(self) -> str:
        return f"{self.task_id} ({self.title})"


class Run(models.Model):
    """One agent turn in a route, owned by one session, client and route."""

    State = RunState
    Delivery = DeliveryMode

    run_id = models.CharField(max_length=64, unique=True, default=new_run_id, editable=False)
    session = models.ForeignKey(AgentSession, on_delete=models.CASCADE, related_name="runs")
    client = models.ForeignKey(Client, on_delete=models.CASCADE, related_name="runs")
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="runs")
    task = models.ForeignKey(
        Task, on_delete=models.PROTECT, related_name="runs", null=True, blank=True
    )
    client_conversation_id = models.CharField(max_length=200)
    client_turn_id = models.CharField(max_length=200)
    user_message_id = models.CharField(max_length=200)
    request_hash = models.CharField(max_length=64)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PREPARING)
    delivery_mode = models.CharField(
        max_length=16, choices=Delivery.choices, default=Delivery.LEGACY
    )
    context = models.JSONField(default=dict, blank=True)
    completion_hash = models.CharField(max_length=64, blank=True)
    completion = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "session",
                    "route",
                    "client_conversation_id",
                    "client_turn_id",
                    "user_message_id",
                ],
                name="bk_run_turn_unique",
            ),
            _choices_check("state", RunState, "bk_run_state_valid"),
            _choices_check("delivery_mode", DeliveryMode, "bk_run_delivery_mode_valid"),
        ]

    def __str__(self) -> str:
        return self.run_id
