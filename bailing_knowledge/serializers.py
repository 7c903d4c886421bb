"""Request validation and the response shapes published in the OpenAPI schema."""

from __future__ import annotations

from rest_framework import serializers

from . import constants


class ErrorSerializer(serializers.Serializer):
    """Every error answer: a wire code and a safe sentence; invalid fields listed by name."""

    error = serializers.CharField(help_text="The wire error code, e.g. `route_not_allowed`.")
    reason = serializers.CharField(help_text="A short, safe explanation for humans.")
    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="For `invalid_request`: messages per offending field.",
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
