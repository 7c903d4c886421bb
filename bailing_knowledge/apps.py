"""Django app configuration."""

from django.apps import AppConfig


class BailingKnowledgeConfig(AppConfig):
    name = "bailing_knowledge"
    verbose_name = "Agent knowledge"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
