"""URLs of the agent knowledge API; mount them with `path("agent-api/v1/", include(...))`."""

from django.urls import path  # noqa: F401

app_name = "bailing_knowledge"

urlpatterns: list = []
