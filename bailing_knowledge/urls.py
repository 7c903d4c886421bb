"""URLs of the agent API.

Mount them with `path("agent-api/v1/", include("bailing_knowledge.urls"))`.
"""

from django.urls import path, re_path

from . import views

app_name = "bailing_knowledge"

urlpatterns = [
    path(
        "workspaces/<slug:route>/knowledge/capabilities",
        views.CapabilitiesView.as_view(),
        name="capabilities",
    ),
    # Last: any other path under the prefix is a JSON 404 with `no-store`.
    re_path(r"^.*$", views.not_found, name="not-found"),
]
