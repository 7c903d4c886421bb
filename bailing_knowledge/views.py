"""HTTP views of the agent knowledge API: parse, call a service, render."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.db import DatabaseCache
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiExample
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.views import APIView

from . import access, constants, services
from .authentication import (
    AgentBearerAuthentication,
    send_behind_authentication,
    work_while_authenticating,
)
from .conf import knowledge_settings
from .deadline import bounded_database_wait
from .exceptions import (
    IdempotencyConflict,
    InvalidRequest,
    KnowledgeChanged,
    KnowledgeReferenceExpired,
    KnowledgeReferenceInvalid,
    KnowledgeScopeChanged,
    NotFound,
    RunNotCurrent,
    exception_handler,
)
from .openapi import document, error_responses
from .parsers import AgentJSONParser
from .permissions import AgentRoutePermission, IsAgentSession
from .renderers import AgentJSONRenderer, JSONOnlyNegotiation
from .serializers import (
    CapabilitiesSerializer,
    CompleteRequestSerializer,
    CompleteResponseSerializer,
    ReadRequestSerializer,
    ReadResponseSerializer,
    SearchRequestSerializer,
    SearchResponseSerializer,
    TurnRequestSerializer,
    TurnResponseSerializer,
)
from .services.read import read
from .services.runs import current_run
from .services.search import early_search, forget_early_search, search
from .services.turns import complete_run, start_turn
from .statements import discard, sending_ahead_pays
from .throttling import ClientRateThrottle, SessionRateThrottle

logger = logging.getLogger("bailing_knowledge")

NO_STORE = "no-store"

#: Bodies of at most this many bytes (by their `Content-Length`) are read before the token
#: is checked and validated while it is (`AgentAPIView.body`): an agent's search or read
#: body is a few hundred bytes, and a caller whose token turns out unknown costs no more
#: than reading and parsing that much.
EARLY_BODY_BYTES = 16 * 1024


class AgentAPIView(APIView):
    """Base of every agent endpoint: bearer auth, route re-check, throttles, JSON, no-store.

    Policies are set here rather than through `REST_FRAMEWORK`, so the host project's own
    DRF settings neither affect nor are affected by this app.
    """

    authentication_classes = [AgentBearerAuthentication]
    permission_classes = [AgentRoutePermission]
    throttle_classes = [SessionRateThrottle, ClientRateThrottle]
    renderer_classes = [AgentJSONRenderer]
    parser_classes = [AgentJSONParser]
    content_negotiation_class = JSONOnlyNegotiation
    schema = AutoSchema()
    database_deadline = None
    #: The serializer of the request's body, which `body` validates; None: no body. It may
    #: run while the database connection is busy with authentication's statement, so it
    #: should not use the database (one that does is validated again after it).
    body_serializer: type[Serializer] | None = None
    _body: Any = None
    _body_error: Exception | None = None
    #: The token and route whose remembered search this request sent ahead (`SearchView`).
    _early_key: tuple[str, str] | None = None

    def get_exception_handler(self) -> Any:
        return exception_handler

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        """The view, outside `ATOMIC_REQUESTS` on every database: each service opens the
        transactions it needs, and a request transaction would commit after `dispatch`,
        beyond the request's `DATABASE_WAIT_MS`."""
        view = super().as_view(**initkwargs)
        for alias in connections:
            view = transaction.non_atomic_requests(using=alias)(view)
        return view

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # Every database wait of the request, authentication included, shares one budget.
        with bounded_database_wait() as deadline:
            self.database_deadline = deadline
            try:
                return super().dispatch(request, *args, **kwargs)
            finally:
                _discard_unclaimed()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        if self.body_serializer is not None and _read_small_body(request):
            # The body is parsed and validated while the server runs authentication's
            # statement, instead of after it (`body`).
            work_while_authenticating(request, functools.partial(self._validate_body, request))
            if self.sends_early:
                send_behind_authentication(request, functools.partial(self.early, request))
        deadline = self.database_deadline
        unchecked = False
        if deadline is not None:
            # Authentication's statement (the access function, which only reads) is the
            # request's first; on the deadline's connection, it is that connection's health
            # check. Inside the view's error handling: a failed connect is a JSON 503.
            on_it = access.session_database() == deadline.connection.alias
            unchecked = deadline.connect(first_statement_checks=on_it)
        try:
            try:
                super().initial(request, *args, **kwargs)
            except DatabaseError:
                if not (unchecked and deadline is not None and deadline.reconnect()):
                    raise
                # The kept connection was dead: the checks again, on the new one.
                super().initial(request, *args, **kwargs)
        finally:
            if unchecked and deadline is not None:
                deadline.settle()

    #: Whether the view has statements sent behind authentication's (`early`).
    sends_early = False

    def early(self, request: Request, cursor: Any, token_hash: str) -> Iterable[list[str]] | None:
        """Statements to send right behind authentication's, before the token is known,
        for the handler to claim (`send_behind_authentication`), in groups; None: none."""
        return None

    def body(self, request: Request) -> Any:
        """The request's body, validated by `body_serializer`.

        A body of up to `EARLY_BODY_BYTES` is read before authentication's statement is sent
        and parsed and validated while it runs: both are Python, the statement's time is the
        server's, and the search's median fell by about 4 % (docs/performance.md). An
        invalid body is refused here all the same, once authentication, the route's
        permission and the throttles have passed, as when it is validated here."""
        if isinstance(self._body_error, DatabaseError):
            # Its serializer used the database while it was busy: validated again now.
            self._body_error = None
        self._validate_body(request)
        if self._body_error is not None:
            raise self._body_error
        return self._body

    def _validate_body(self, request: Request) -> None:
        """Validate the body once; its data or its error is kept for `body`."""
        if self._body is not None or self._body_error is not None:
            return
        assert self.body_serializer is not None
        try:
            serializer = self.body_serializer(data=request.data)
            serializer.is_valid(raise_exception=True)
        except Exception as exc:  # raised by `body`, in the view's turn
            self._body_error = exc
        else:
            self._body = serializer.validated_data

    def finalize_response(
        self, request: Request, response: HttpResponse, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        response = super().finalize_response(request, response, *args, **kwargs)
        response["Cache-Control"] = NO_STORE
        if self._early_key is not None and response.status_code >= 400:
            forget_early_search(*self._early_key)
        return response


class CapabilitiesView(AgentAPIView):
    """What this server supports on a route: protocol, delivery modes and limits."""

    @document(
        operation_id="knowledge_capabilities",
        summary="Knowledge capabilities of a route",
        responses={200: CapabilitiesSerializer, **error_responses()},
        examples=[
            OpenApiExample(
                "capabilities",
                value={
                    "schema_version": constants.SCHEMA_CAPABILITIES,
                    "protocol": constants.PROTOCOL,
                    "supported": True,
                    "route": "order-assistant",
                    "enabled": True,
                    "knowledge_scope_revision": "ksr_3f9a1c0d5e7b2a4c6d8e0f1a2b3c4d5e",
                    "delivery_modes": list(constants.DELIVERY_MODES),
                    "limits": dict(constants.LIMITS),
                },
                response_only=True,
                status_codes=["200"],
            )
        ],
        tags=["knowledge"],
    )
    def get(self, request: Request, route: str) -> Response:
        return Response(services.capabilities(request.agent_route))


class SearchView(AgentAPIView):
    """Up to three hints for a query, each with a reference to read; 4096 bytes at most."""

    body_serializer = SearchRequestSerializer
    sends_early = True

    def early(self, request: Request, cursor: Any, token_hash: str) -> Iterator[list[str]] | None:
        """The opening statements of the search the body asks for, composed from what the
        token last searched on this route (`services.search.early_search`): the server
        runs them while the token is checked and the body validated, and the search uses
        their answers only if it would have sent exactly them. Not for a search within a
        run, whose check comes first."""
        route_key = self.kwargs.get("route")
        if not knowledge_settings.SEARCH_SEND_AHEAD or not sending_ahead_pays():
            return None
        if request.content_type.split(";")[0].strip().lower() != "application/json":
            return None
        if isinstance(caches[knowledge_settings.THROTTLE_CACHE], DatabaseCache):
            return None  # the rate limits' first read would discard them: nothing to gain
        try:
            data = json.loads(request.body)
        except (ValueError, RecursionError):  # the parser answers for the body
            return None
        if not isinstance(data, dict) or "run_id" in data:
            return None
        query = data.get("query")
        if not isinstance(query, str) or not isinstance(route_key, str):
            return None
        self._early_key = (token_hash, route_key)
        return _quietly(lambda: early_search(cursor, token_hash, route_key, query))

    @document(
        operation_id="knowledge_search",
        summary="Search the route's knowledge",
        request=SearchRequestSerializer,
        responses={
            200: SearchResponseSerializer,
            **error_responses({400: (InvalidRequest,), 409: (RunNotCurrent,)}),
        },
        tags=["knowledge"],
    )
    def post(self, request: Request, route: str) -> Response:
        data = self.body(request)
        run = None
        if "run_id" in data:
            run = current_run(request.auth, request.agent_route, data["run_id"])
        body = search(
            request.auth, request.agent_route, data["query"], limit=data["limit"], run=run
        )
        return Response(body)


class ReadView(AgentAPIView):
    """One page of a referenced document; follow `next_cursor` for the next one."""

    body_serializer = ReadRequestSerializer

    @document(
        operation_id="knowledge_read",
        summary="Read a referenced document, page by page",
        request=ReadRequestSerializer,
        responses={
            200: ReadResponseSerializer,
            **error_responses(
                {
                    400: (InvalidRequest, KnowledgeReferenceInvalid),
                    409: (RunNotCurrent, KnowledgeScopeChanged, KnowledgeChanged),
                    410: (KnowledgeReferenceExpired,),
                }
            ),
        },
        tags=["knowledge"],
    )
    def post(self, request: Request, route: str) -> Response:
        data = self.body(request)
        body = read(
            request.auth,
            request.agent_route,
            data["ref"],
            cursor=data.get("cursor"),
            run_id=data.get("run_id"),
            max_bytes=data["max_bytes"],
        )
        return Response(body)


class TurnView(AgentAPIView):
    """Start (or replay) an agent turn: its run, frozen context and knowledge delivery."""

    body_serializer = TurnRequestSerializer

    @document(
        operation_id="agent_turn",
        summary="Start an agent turn",
        request=TurnRequestSerializer,
        responses={
            200: TurnResponseSerializer,
            **error_responses({400: (InvalidRequest,), 409: (IdempotencyConflict, RunNotCurrent)}),
        },
        tags=["runs"],
    )
    def post(self, request: Request, route: str) -> Response:
        data = _plain(self.body(request))
        return Response(start_turn(request.auth, request.agent_route, data))


class CompleteRunView(AgentAPIView):
    """Close a run; replaying the same completion is harmless, changing it is refused."""

    permission_classes = [IsAgentSession]
    body_serializer = CompleteRequestSerializer

    @document(
        operation_id="agent_run_complete",
        summary="Complete a run",
        request=CompleteRequestSerializer,
        responses={
            200: CompleteResponseSerializer,
            **error_responses({400: (InvalidRequest,), 409: (IdempotencyConflict, RunNotCurrent)}),
        },
        tags=["runs"],
    )
    def post(self, request: Request, run_id: str) -> Response:
        data = _plain(self.body(request))
        return Response(complete_run(request.auth, run_id, data))


def _quietly(groups: Callable[[], Iterable[list[str]] | None]) -> Iterator[list[str]]:
    """The groups of statements `groups()` composes, up to an error, which ends them: the
    search itself meets it again and answers for it (what was sent is then discarded)."""
    try:
        yield from groups() or ()
    except Exception:
        logger.warning("Could not compose a search's opening statements", exc_info=True)


def _discard_unclaimed() -> None:
    """Drop statements sent behind authentication's that the request did not claim (a
    refused request, or a search that needed others). A connection that cannot is closed
    (`statements.discard`); the response stands."""
    try:
        discard(connections[DEFAULT_DB_ALIAS])
    except DatabaseError:
        logger.warning("Could not discard unclaimed statements", exc_info=True)


def _read_small_body(request: Request) -> bool:
    """Read a body that declares at most `EARLY_BODY_BYTES` now, before authentication's
    statement: the client's upload is then never waited for while the database is (whose
    time counts against the request's `DATABASE_WAIT_MS`). False for a larger body, one
    without a length, and one that cannot be read now (the parser meets it again later)."""
    try:
        if int(request.META["CONTENT_LENGTH"]) > EARLY_BODY_BYTES:
            return False
        request.body  # noqa: B018 (Django keeps it: the parser reads it from memory)
    except Exception:
        return False
    return True


def _plain(data: Any) -> Any:
    """Validated data as plain JSON values (nested serializers return OrderedDicts)."""
    if isinstance(data, dict):
        return {key: _plain(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_plain(value) for value in data]
    return data


@csrf_exempt
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """JSON 404 with `no-store` for any unknown path under the app's URLs, whatever the method.

    Exempt from CSRF: otherwise a POST to a mistyped path is Django's HTML 403, which clients
    report as a permissions problem.
    """
    response = exception_handler(NotFound(), {})
    response.accepted_renderer = AgentJSONRenderer()
    response.accepted_media_type = AgentJSONRenderer.media_type
    response.renderer_context = {}
    response["Cache-Control"] = NO_STORE
    return response.render()
