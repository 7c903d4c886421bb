from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("agent-api/v1/", include("bailing_knowledge.urls")),
]
