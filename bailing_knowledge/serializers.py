"""Request validation and the response shapes published in the OpenAPI schema."""

from __future__ import annotations

import copy
import json
import re

from django.core.validators import RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from . import constants


class ErrorSerializer(serializers.Serializer):
    """Every error answer: a wire code and a safe sentence; invalid fields listed by name."""

    error = serializers.CharField(help_text="The wire error code, e.g. `route_not_allowed`.")
    reason = serializers.CharField(help_text="A short, safe explanation for humans.")
    fields = serializers.DictField(
        required=False,
        help_text="For `invalid_request`: a list of messages per offending field; the errors "
        "of a nested object are an object of the same form, those of a list's items an "
        "object keyed by the item's index.",
    )


class LimitsSerializer(serializers.Serializer):
    search_max_results = serializers.IntegerField(default=constants.SEARCH_MAX_RESULTS)
    search_max_bytes = serializers.IntegerField(default=constants.SEARCH_MAX_BYTES)
    read_default_bytes = serializers.IntegerField(default=constants.READ_DEFAULT_BYTES)
    read_max_bytes = serializers.IntegerField(default=constants.READ_MAX_BYTES)
    reference_ttl_seconds = serializers.IntegerField(default=constants.REFERENCE_TTL_SECONDS)
    read_chain_max_bytes = serializers.IntegerField(default=constants.READ_CHAIN_MAX_BYTES)


class CapabilitiesSerializer(serializers.Serializer):
    schema_version = serializers.ChoiceField(choices=[constants.SCHEMA_CAPABILITIES])
    protocol = serializers.ChoiceField(choices=[constants.PROTOCOL])
    supported = serializers.BooleanField()
    route = serializers.CharField()
    enabled = serializers.BooleanField(
        help_text="Knowledge is on for this route and at least one of its KBs is enabled."
    )
    knowledge_scope_revision = serializers.CharField(
        help_text="Changes exactly when the route's knowledge configuration changes."
    )
    delivery_modes = serializers.ListField(
        child=serializers.ChoiceField(choices=list(constants.DELIVERY_MODES))
    )
    limits = LimitsSerializer()


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


class StrictCharField(serializers.CharField):
    """A string, and only a string: numbers and booleans are not silently converted.

    Never trimmed: a reference, cursor or identifier is taken exactly as sent. Unless blank
    is allowed, the schema says `minLength: 1`, as the server does.
    """

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("trim_whitespace", False)
        if not kwargs.get("allow_blank", False):
            kwargs.setdefault("min_length", 1)
        super().__init__(**kwargs)

    def to_internal_value(self, data: object) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: no strings, floats or booleans."""

    def to_internal_value(self, data: object) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictSerializer(serializers.Serializer):
    """Rejects fields it does not declare: identity, route or KB ids never come from a body."""

    def get_fields(self) -> dict[str, serializers.Field]:
        # DRF deep-copies each declared field for every instance, building the field and its
        # validators again: most of a request body's validation time. Until `bind`, which
        # sets its state on the copy, a field without nested fields holds nothing that a
        # request changes, so a shallow copy serves; nesting fields are still deep-copied.
        return {
            name: copy.deepcopy(field) if _nests(field) else copy.copy(field)
            for name, field in self._declared_fields.items()
        }

    def to_internal_value(self, data: object) -> dict:
        if not isinstance(data, dict):
            raise serializers.ValidationError({"non_field_errors": ["Expected a JSON object."]})
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            # Name identifier-like fields (e.g. `client_id`); never echo arbitrary text.
            named = [n for n in unknown if _IDENTIFIER.fullmatch(n)][:10]
            errors = {name: ["This field is not accepted."] for name in named}
            if len(named) < len(unknown):
                errors["non_field_errors"] = ["The request has fields that are not accepted."]
            raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


def _nests(field: serializers.Field) -> bool:
    """Whether `field` holds fields of its own (a serializer, a list's or dict's child)."""
    return isinstance(field, serializers.BaseSerializer) or hasattr(field, "child")


class SearchRequestSerializer(StrictSerializer):
    query = StrictCharField(
        max_length=constants.SEARCH_MAX_QUERY_CHARS,
        # Also published as the schema's `pattern`: not only whitespace.
        validators=[RegexValidator(r"\S", message="The query must not be blank.")],
        help_text="What to look for; 1 to 2000 characters, not all whitespace.",
    )
    limit = StrictIntegerField(
        min_value=1,
        max_value=constants.SEARCH_MAX_RESULTS,
        default=constants.SEARCH_MAX_RESULTS,
        help_text="How many hints at most (1 to 3).",
    )
    run_id = StrictCharField(
        max_length=64, required=False, help_text="The current run, when searching within one."
    )


class SearchHintSerializer(serializers.Serializer):
    ref = serializers.CharField(help_text="Opaque reference for `read`; valid for 300 s.")
    title = serializers.CharField()
    summary = serializers.CharField(help_text="An excerpt of the hit's current text.")
    revision = serializers.IntegerField()
    score = serializers.FloatField(
        help_text="Ranking score in (0, 1]: fused rank, not a probability of relevance."
    )
    expires_at = serializers.DateTimeField(help_text="When `ref` stops being accepted (UTC).")


class SearchResponseSerializer(serializers.Serializer):
    schema_version = serializers.ChoiceField(choices=[constants.SCHEMA_SEARCH])
    route = serializers.CharField()
    run_id = serializers.CharField(required=False, help_text="Present when the request had one.")
    knowledge_scope_revision = serializers.CharField()
    status = serializers.ChoiceField(choices=list(constants.SEARCH_STATUSES))
    trust = serializers.ChoiceField(choices=[constants.TRUST_REFERENCE_ONLY])
    hints = SearchHintSerializer(many=True)
    truncated = serializers.BooleanField()


class ReadRequestSerializer(StrictSerializer):
    ref = StrictCharField(max_length=4096, help_text="A `ref` from a search hint.")
    cursor = StrictCharField(
        max_length=4096,
        required=False,
        help_text="The previous page's `next_cursor`, to continue the chain.",
    )
    run_id = StrictCharField(
        max_length=64,
        required=False,
        help_text="The run the ref was issued in; exactly as at search time.",
    )
    max_bytes = StrictIntegerField(
        min_value=constants.READ_MIN_BYTES,
        max_value=constants.READ_MAX_BYTES,
        default=constants.READ_DEFAULT_BYTES,
        help_text="Upper bound of the whole response in UTF-8 bytes (4096 to 32768).",
    )


class ReadResponseSerializer(serializers.Serializer):
    schema_version = serializers.ChoiceField(choices=[constants.SCHEMA_READ])
    route = serializers.CharField()
    run_id = serializers.CharField(required=False, help_text="Present when the request had one.")
    knowledge_scope_revision = serializers.CharField()
    ref = serializers.CharField()
    revision = serializers.IntegerField()
    title = serializers.CharField()
    content = serializers.CharField(help_text="This page of the document, cut between graphemes.")
    trust = serializers.ChoiceField(choices=[constants.TRUST_REFERENCE_ONLY])
    next_cursor = serializers.CharField(
        allow_null=True, help_text="Send it with the same `ref` for the next page; null at the end."
    )
    truncated = serializers.BooleanField(help_text="The source has text this page does not show.")
    budget_exhausted = serializers.BooleanField(
        help_text="The chain reached its byte limit before covering the whole source."
    )
    total_content_bytes = serializers.IntegerField(help_text="UTF-8 size of the whole body.")
    read_chain_max_bytes = serializers.IntegerField()


_RENDERER_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
PAGE_CONTEXT_MAX_BYTES = 16384


class TaskBindingSerializer(StrictSerializer):
    schema_version = serializers.ChoiceField(
        choices=[constants.SCHEMA_TASK_BINDING],
        error_messages={"invalid_choice": f"Must be {constants.SCHEMA_TASK_BINDING}."},
    )
    task_id = StrictCharField(max_length=64)
    scope_hash = StrictCharField(max_length=64, help_text="The task's current scope hash.")


@extend_schema_field(
    {
        "type": "array",
        # "No character outside the set", the same in every regex dialect (a `$` would
        # let a trailing newline through in some).
        "items": {
            "type": "string",
            "pattern": r"^[a-z0-9](?![\s\S]*[^a-z0-9._-])",
            "maxLength": 64,
        },
        "maxItems": constants.TURN_MAX_RENDERERS,
        "uniqueItems": True,
    }
)
class RendererNamesField(serializers.ListField):
    """Renderer names, published with the rules `validate_renderers` enforces."""


class TurnRequestSerializer(StrictSerializer):
    client_conversation_id = StrictCharField(max_length=200)
    client_turn_id = StrictCharField(max_length=200)
    user_message_id = StrictCharField(max_length=200)
    user_input = StrictCharField(max_length=constants.TURN_MAX_INPUT_CHARS)
    page_context = serializers.DictField(
        required=False, help_text="What the user is looking at (a JSON object, ≤ 16 KB)."
    )
    renderers = RendererNamesField(
        child=StrictCharField(max_length=64),
        required=False,
        max_length=constants.TURN_MAX_RENDERERS,
        help_text="Renderer names the host supports (at most 20, unique).",
    )
    task_binding = TaskBindingSerializer(required=False)
    knowledge_delivery = serializers.ChoiceField(
        choices=list(constants.DELIVERY_MODES),
        required=False,
        error_messages={"invalid_choice": 'Must be "inline" or "on_demand".'},
        help_text="Omit for legacy inline delivery; `on_demand` only after capabilities.",
    )

    def validate_page_context(self, value: object) -> object:
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        size = len(json.dumps(value, ensure_ascii=False).encode("utf-8"))
        if size > PAGE_CONTEXT_MAX_BYTES:
            raise serializers.ValidationError("Must be at most 16384 bytes of JSON.")
        return value

    def validate_renderers(self, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise serializers.ValidationError("Renderer names must be unique.")
        if not all(_RENDERER_NAME.fullmatch(name) for name in value):
            raise serializers.ValidationError(
                "Renderer names are lowercase letters, digits, '.', '_' or '-'."
            )
        return value


class KnowledgeItemSerializer(serializers.Serializer):
    ref = serializers.CharField()
    title = serializers.CharField()
    revision = serializers.IntegerField()
    score = serializers.FloatField()
    kind = serializers.ChoiceField(choices=["chunk", "document"])
    content = serializers.CharField(help_text="Reference-only text: not instructions.")
    truncated = serializers.BooleanField()
    trust = serializers.ChoiceField(choices=[constants.TRUST_REFERENCE_ONLY])


class TurnResponseSerializer(serializers.Serializer):
    schema_version = serializers.ChoiceField(choices=[constants.SCHEMA_TURN_CONTEXT])
    run_id = serializers.CharField()
    route = serializers.CharField()
    knowledge_scope_revision = serializers.CharField()
    knowledge = KnowledgeItemSerializer(many=True)
    knowledge_refs = serializers.ListField(child=serializers.DictField())
    context = serializers.DictField(
        help_text="Echoed request context; `knowledge_delivery` for on-demand delivery."
    )


class CompleteRequestSerializer(StrictSerializer):
    assistant_message_id = StrictCharField(max_length=200)
    status = serializers.ChoiceField(
        choices=list(constants.RUN_END_STATES),
        default="completed",
        error_messages={"invalid_choice": 'Must be "completed", "failed" or "cancelled".'},
    )
    content = StrictCharField(required=False, allow_blank=True)
    model = StrictCharField(required=False, allow_blank=True, max_length=200)
    # Any JSON value; null is the same as leaving the field out.
    runtime = serializers.JSONField(required=False, allow_null=True)
    usage = serializers.JSONField(required=False, allow_null=True)


class CompleteResponseSerializer(serializers.Serializer):
    schema_version = serializers.ChoiceField(choices=[constants.SCHEMA_RUN_COMPLETION])
    run_id = serializers.CharField()
    state = serializers.ChoiceField(choices=list(constants.RUN_END_STATES))
    completed_at = serializers.DateTimeField()
