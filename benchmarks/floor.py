"""The floor a small agent endpoint is measured against: DRF with nothing of the product.

`FloorView` does the least an authenticated JSON endpoint can do in this process: the same
middleware, URL routing and DRF request/response cycle as the agent API, then the bearer
token looked up by its SHA-256 with one SQL statement on a cursor. No authentication,
permission or throttle classes, no ORM, no route re-check. The capabilities endpoint does
the same job plus the product's checks, so their ratio is what those checks cost.
"""

from __future__ import annotations

from typing import Any

from django.db import connection
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from bailing_knowledge.models import hash_token

_SESSION = """
SELECT session_id, principal_id
FROM bailing_knowledge_agentsession
WHERE token_hash = %s AND revoked_at IS NULL AND expires_at > now()
"""


class FloorView(APIView):
    """A bearer-token lookup and a small JSON body."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []
    throttle_classes: list[Any] = []
    renderer_classes = [JSONRenderer]

    def get(self, request: Request, route: str) -> Response:
        scheme, _, token = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return Response({"error": "unauthenticated"}, status=401)
        with connection.cursor() as cursor:
            cursor.execute(_SESSION, [hash_token(token)])
            row = cursor.fetchone()
        if row is None:
            return Response({"error": "unauthenticated"}, status=401)
        return Response({"route": route, "session": row[0], "principal": row[1]})
