"""Django app configuration."""

from django.apps import AppConfig


class BailingKnowledgeConfig(AppConfig):
    name = "bailing_knowledge"
    verbose_name = "Agent knowledge"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import pre_delete

        from . import checks  # noqa: F401  (registers the system checks)
        from .ingestion.lexicon import lock_before_delete
        from .models import Document, KnowledgeBase

        for model in (KnowledgeBase, Document):
            pre_delete.connect(
                lock_before_delete, sender=model, dispatch_uid=f"bailing_knowledge.{model.__name__}"
            )
