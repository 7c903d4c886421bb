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
    path(
        "workspaces/<slug:route>/knowledge/search",
        views.SearchView.as_view(),
        name="search",
    ),
    path(
        "workspaces/<slug:route>/knowledge/read",
        views.ReadView.as_view(),
        name="read",
    ),
    path("workspaces/<slug:route>/turns", views.TurnView.as_view(), name="turns"),
    path("runs/<str:run_id>/complete", views.CompleteRunView.as_view(), name="run-complete"),
    # Last: any other path under the prefix is a JSON 404 with `no-store` (newlines too).
    re_path(r"^[\s\S]*$", views.not_found, name="not-found"),
]
