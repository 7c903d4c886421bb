"""A URLconf with host views under the agent prefix that fail outside the app's views."""

from django.db import OperationalError
from django.urls import include, path


def database_down(request):
    raise OperationalError("boom SELECT 1 FROM secrets")


def crash(request):
    raise RuntimeError("internal detail /etc/passwd")


urlpatterns = [
    path("agent-api/v1/db-down", database_down),
    path("agent-api/v1/crash", crash),
    path("agent-api/v1/", include("bailing_knowledge.urls")),
]
