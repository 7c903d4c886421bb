"""The admin's forms: each one hands its input to a service, which applies the rules.

Field errors come from the services' `ValidationError`s, so the admin, the CLI and the
Python API refuse the same input with the same messages.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django import forms
from django.core.exceptions import NON_FIELD_ERRORS, ObjectDoesNotExist, ValidationError

from .. import services
from ..conf import knowledge_settings
from ..models import AgentSession, Client, KnowledgeBase, Route
from ..retrieval.analysis import DEFAULT_LANGUAGE, LANGUAGES
from .actions import error_text
from .widgets import MultipleFileInput, WrappedSelectMultiple


class KnowledgeBaseForm(forms.ModelForm):
    """Offers the configured embedders and the supported languages as choices."""

    embedder = forms.ChoiceField(
        choices=(),
        help_text="Alias of an embedder in BAILING_KNOWLEDGE['EMBEDDERS'].",
    )
    language = forms.ChoiceField(
        choices=list(LANGUAGES.items()),
        initial=DEFAULT_LANGUAGE,
        help_text=(
            f"{KnowledgeBase._meta.get_field('language').help_text} "
            "Changing it re-indexes the documents."
        ),
    )

    class Meta:
        model = KnowledgeBase
        fields = ("slug", "title", "description", "enabled", "embedder", "language", "tenant")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        embedders = knowledge_settings.EMBEDDERS
        aliases = sorted(embedders) if isinstance(embedders, dict) else []
        self.fields["embedder"].choices = [(alias, alias) for alias in aliases]


def _seconds(value: timedelta | int) -> int:
    return int(value.total_seconds()) if isinstance(value, timedelta) else int(value)


def _split_list(value: str) -> list[str]:
    """'a, b' -> ['a', ' b']; blank -> []. The service strips and validates the items."""
    return value.split(",") if value.strip() else []


class IssueSessionForm(forms.ModelForm):
    """Issues a session through `services.issue_session` when it validates.

    The session is created during validation (inside the admin's transaction), so that
    every rule of the service reports its error on the matching field. The raw token is
    kept on `self.issued` only; no field of the form ever holds it.
    """

    # Service error keys -> form fields.
    ERROR_FIELDS = {
        "client": "client",
        "principal_id": "principal_id",
        "principal_tenant": "tenant",
        "principal_roles": "roles",
        "principal_audience": "audience",
        "on_behalf_of": "on_behalf_of",
        "routes": "routes",
        "allowed_routes": "routes",
        "lifetime": "lifetime",
        "expires_at": "lifetime",
        "device_label": "device_label",
    }

    client = forms.ModelChoiceField(queryset=Client.objects.order_by("app_id"))
    principal_id = forms.CharField(
        max_length=200, help_text="The business user (or service) the agent acts for."
    )
    tenant = forms.CharField(max_length=128, required=False)
    roles = forms.CharField(required=False, help_text="Comma-separated, e.g. support, billing.")
    audience = forms.CharField(max_length=64, required=False)
    on_behalf_of = forms.CharField(max_length=200, required=False)
    routes = forms.ModelMultipleChoiceField(
        queryset=Route.objects.order_by("route_key"),
        widget=WrappedSelectMultiple("routes", is_stacked=False),
        help_text="Must be among the client's allowed routes.",
    )
    lifetime = forms.IntegerField(required=False, label="Lifetime (seconds)")
    device_label = forms.CharField(max_length=200, required=False)

    class Meta:
        model = AgentSession
        fields = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.issued: services.IssuedSession | None = None
        default = _seconds(knowledge_settings.SESSION_DEFAULT_LIFETIME)
        maximum = _seconds(knowledge_settings.SESSION_MAX_LIFETIME)
        help_text = f"Empty for the default ({default} s); at most {maximum} s."
        self.fields["lifetime"].help_text = help_text

    def _post_clean(self) -> None:
        if self._errors:
            return
        data = self.cleaned_data
        try:
            self.issued = services.issue_session(
                data["client"],
                principal_id=data["principal_id"],
                routes=list(data["routes"]),
                tenant=data["tenant"],
                roles=_split_list(data["roles"]),
                audience=data["audience"],
                on_behalf_of=data["on_behalf_of"],
                lifetime=data["lifetime"],
                device_label=data["device_label"],
            )
        except (ValidationError, ObjectDoesNotExist) as exc:
            self._add_service_errors(exc)
            return
        except OverflowError:
            # A lifetime beyond what `timedelta` can hold fails before the service's check.
            self.add_error("lifetime", "The lifetime is out of range.")
            return
        self.instance = self.issued.session

    def _add_service_errors(self, exc: Exception) -> None:
        if not isinstance(exc, ValidationError) or not hasattr(exc, "error_dict"):
            self.add_error(None, error_text(exc))
            return
        for key, errors in exc.error_dict.items():
            field = self.ERROR_FIELDS.get(key)
            for error in errors:
                text = "; ".join(error.messages)
                if field is None and key != NON_FIELD_ERRORS:
                    text = f"{key}: {text}"
                self.add_error(field, text)

    def _save_m2m(self) -> None:
        """The service already stored the routes."""


class MultipleFileField(forms.FileField):
    widget = MultipleFileInput

    def clean(self, data: Any, initial: Any = None) -> list:
        files = data if isinstance(data, list | tuple) else [data]
        cleaned = [super(MultipleFileField, self).clean(item, initial) for item in files if item]
        if not cleaned:
            raise ValidationError("Choose at least one file.")
        return cleaned


class DocumentUploadForm(forms.Form):
    knowledge_base = forms.ModelChoiceField(queryset=KnowledgeBase.objects.all())
    files = MultipleFileField(help_text="Files with the same name update the same document.")
