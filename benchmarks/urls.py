"""The agent API mounted where the example project mounts it, and the benchmarks' floor view."""

from django.urls import include, path

from .floor import FloorView

urlpatterns = [
    path("agent-api/v1/", include("bailing_knowledge.urls")),
    path("bench/floor/<slug:route>/capabilities", FloorView.as_view()),
]
