"""The agent API mounted where the example project mounts it."""

from django.urls import include, path

urlpatterns = [path("agent-api/v1/", include("bailing_knowledge.urls"))]
