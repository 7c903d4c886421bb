"""Shared plumbing for the management commands, so that the four commands stay thin.

Each command only declares its subcommands and calls `bailing_knowledge.services`. This module
owns what they have in common: subcommand dispatch, `--json` output, argument types (on/off
switches, lifetimes, finite floats), turning service errors into `CommandError`, and the
JSON-ready views of the models. Every view leaves secrets out: a session's token and its hash
never reach the output.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from django.core.exceptions import NON_FIELD_ERRORS, ObjectDoesNotExist, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, IntegrityError

from ..ingestion.loaders import storable_text
from ..models import AgentSession, Client, KnowledgeBase, Route, Task

# ---------------------------------------------------------------------------------------------
# Argument types: each raises ArgumentTypeError, which argparse reports as a CommandError.
# ---------------------------------------------------------------------------------------------

_SWITCH_VALUES = {"on": True, "off": False, "true": True, "false": False, "yes": True, "no": False}


def on_off(value: str) -> bool:
    """Parse a runtime switch written as `on` or `off`."""
    try:
        return _SWITCH_VALUES[value.strip().lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"expected 'on' or 'off', got {value!r}") from None


def finite_float(value: str) -> float:
    """A real number: `nan` would pass the field validators and fail only a DB constraint."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


_LIFETIME = re.compile(r"^\s*(\d+)\s*([smhdw]?)\s*$", re.IGNORECASE)
_LIFETIME_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def lifetime(value: str) -> timedelta:
    """Parse `3600`, `90s`, `30m`, `8h`, `7d` or `2w`; the service enforces the bounds."""
    match = _LIFETIME.match(value)
    if not match:
        raise argparse.ArgumentTypeError(
            f"expected seconds or a number with s/m/h/d/w (e.g. 30m, 8h, 7d), got {value!r}"
        )
    amount, unit = match.groups()
    try:
        return timedelta(seconds=int(amount) * _LIFETIME_UNITS[unit.lower()])
    except OverflowError:  # argparse reports ValueError and TypeError only
        raise argparse.ArgumentTypeError(f"lifetime {value!r} is too large") from None


# ---------------------------------------------------------------------------------------------
# JSON-ready views of the models (also the source of the text output).
# ---------------------------------------------------------------------------------------------


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def knowledge_base_data(kb: KnowledgeBase) -> dict[str, Any]:
    return {
        "slug": kb.slug,
        "title": kb.title,
        "description": kb.description,
        "enabled": kb.enabled,
        "embedder": kb.embedder,
        "language": kb.language,
        "tenant": kb.tenant,
        "routes": sorted(route.route_key for route in kb.routes.all()),
        "created_at": iso(kb.created_at),
        "updated_at": iso(kb.updated_at),
    }


def route_data(route: Route) -> dict[str, Any]:
    return {
        "route_key": route.route_key,
        "name": route.name,
        "enabled": route.enabled,
        "agent_client_enabled": route.agent_client_enabled,
        "knowledge_enabled": route.knowledge_enabled,
        "allowed_audiences": list(route.allowed_audiences),
        "knowledge_bases": sorted(kb.slug for kb in route.bound_knowledge_bases()),
        "top_k": route.top_k,
        "min_score": route.min_score,
        "max_docs": route.max_docs,
        "knowledge_mode": route.knowledge_mode,
        "knowledge_scope_revision": route.knowledge_scope_revision,
        "created_at": iso(route.created_at),
        "updated_at": iso(route.updated_at),
    }


def client_data(client: Client) -> dict[str, Any]:
    return {
        "app_id": client.app_id,
        "name": client.name,
        "enabled": client.enabled,
        "allowed_routes": sorted(route.route_key for route in client.allowed_routes.all()),
        "created_at": iso(client.created_at),
        "updated_at": iso(client.updated_at),
    }


def task_data(task: Task) -> dict[str, Any]:
    from ..services.tasks import task_scope_hash

    return {
        "task_id": task.task_id,
        "title": task.title,
        "state": task.state,
        "members": sorted(session.session_id for session in task.members.all()),
        "scope_hash": task_scope_hash(task),
        "created_at": iso(task.created_at),
        "updated_at": iso(task.updated_at),
    }


def session_data(session: AgentSession, now: datetime | None = None) -> dict[str, Any]:
    """A session without its secret: `token_hint` is a non-secret prefix, never the token."""
    return {
        "session_id": session.session_id,
        "client": session.client.app_id,
        "principal": session.principal,
        "on_behalf_of": session.on_behalf_of,
        "routes": sorted(route.route_key for route in session.allowed_routes.all()),
        "token_hint": session.token_hint,
        "device_label": session.device_label,
        "status": session.status_at(now),
        "active": session.is_active(now),
        "created_at": iso(session.created_at),
        "expires_at": iso(session.expires_at),
        "revoked_at": iso(session.revoked_at),
        "last_seen_at": iso(session.last_seen_at),
    }


# ---------------------------------------------------------------------------------------------
# Text rendering.
# ---------------------------------------------------------------------------------------------


# C0 and C1 controls, DEL, and the bidirectional overrides and isolates: a stored value (a
# title typed in the admin, a principal id from a script) must not move the cursor, recolour
# the terminal or reorder what an operator reads.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def text(value: Any) -> str:
    """One cell of text output: lists joined, booleans as yes/no, blanks as '-', and control
    characters escaped (``\\x1b``), so that what is printed is what is stored, inert."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list | tuple):
        value = ", ".join(str(item) for item in value)
    if value is None or value == "":
        return "-"
    return _CONTROLS.sub(_escape, str(value))


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    cells = [list(headers), *([text(value) for value in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    )


def render_fields(data: Mapping[str, Any]) -> str:
    width = max(len(key) for key in data)
    return "\n".join(f"{key.ljust(width)}  {text(value)}" for key, value in data.items())


# ---------------------------------------------------------------------------------------------
# The base command.
# ---------------------------------------------------------------------------------------------


class KnowledgeCommand(BaseCommand):
    """A command of this app: a database that is down or fails a statement ends it with one
    line that says so, not a traceback (`--traceback` still shows one)."""

    def execute(self, *args: Any, **options: Any) -> str | None:
        for value in _strings(args, options):
            if storable_text(value) != value:
                # Bytes the locale could not decode arrive as lone surrogates, which neither
                # UTF-8 nor PostgreSQL can hold: the driver would raise deep in a statement.
                raise CommandError(f"Argument {value!r} is not valid UTF-8 text, or contains NUL.")
        try:
            return super().execute(*args, **options)
        except DatabaseError as exc:
            # Down (OperationalError), or refusing a statement: a read-only standby, a
            # revoked privilege. One line either way.
            reason = next(iter(str(exc).strip().splitlines()), "") or type(exc).__name__
            raise CommandError(f"The database failed: {reason}") from exc


def _strings(args: tuple[Any, ...], options: Mapping[str, Any]) -> Iterator[str]:
    """The text a command was given: positional and option values, lists included (paths
    are not text, and may hold any bytes the file system allows)."""
    for value in (*args, *options.values()):
        for item in value if isinstance(value, list | tuple) else (value,):
            if isinstance(item, str):
                yield item


class ServiceCommand(KnowledgeCommand):
    """A command made of subcommands, each handled by a `handle_<name>` method.

    Subclasses implement `add_subcommands` and the handlers; this class dispatches, and turns
    the services' `ValidationError` and `DoesNotExist` into a `CommandError` that names the
    offending option (`field_options` maps model fields to option names).
    """

    field_options: ClassVar[dict[str, str]] = {}
    # Where a subcommand takes a field by another name (a positional argument, say).
    subcommand_field_options: ClassVar[dict[str, dict[str, str]]] = {}

    def add_arguments(self, parser: CommandParser) -> None:
        subparsers = parser.add_subparsers(
            title="subcommands", dest="subcommand", metavar="SUBCOMMAND", required=True
        )
        self.add_subcommands(subparsers)

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        raise NotImplementedError

    @staticmethod
    def add_subcommand(
        subparsers: argparse._SubParsersAction, name: str, help_text: str
    ) -> CommandParser:
        """Add a subcommand; every subcommand takes `--json`."""
        parser: CommandParser = subparsers.add_parser(name, help=help_text, description=help_text)
        parser.add_argument(
            "--json",
            action="store_true",
            help="Print one JSON document to stdout instead of text.",
        )
        return parser

    def handle(self, *args: Any, subcommand: str, **options: Any) -> None:
        handler: Callable[..., None] = getattr(self, "handle_" + subcommand.replace("-", "_"))
        try:
            handler(**options)
        except ValidationError as exc:
            raise CommandError(self.format_validation_error(exc, subcommand)) from exc
        except ObjectDoesNotExist as exc:
            raise CommandError(str(exc) or "No such object.") from exc
        except IntegrityError as exc:  # e.g. two admins creating the same slug at once
            raise CommandError(f"The database rejected the change: {exc}") from exc

    def format_validation_error(self, exc: ValidationError, subcommand: str = "") -> str:
        if not hasattr(exc, "error_dict"):
            return "\n".join(exc.messages)
        options = {**self.field_options, **self.subcommand_field_options.get(subcommand, {})}
        lines = []
        for field, messages in exc.message_dict.items():
            label = "" if field == NON_FIELD_ERRORS else options.get(field, field)
            lines.extend(f"{label}: {message}" if label else message for message in messages)
        return "\n".join(lines)

    # -- output ---------------------------------------------------------------------------------

    def write_json(self, data: Any) -> None:
        self.stdout.write(json.dumps(data, indent=2, ensure_ascii=False))

    def write_record(self, options: Mapping[str, Any], data: Mapping[str, Any], done: str) -> None:
        """Print one object: as JSON, or as a success line followed by its fields."""
        if options["json"]:
            self.write_json(data)
            return
        self.stdout.write(self.style.SUCCESS(done))
        self.stdout.write(render_fields(data))

    def write_list(
        self,
        options: Mapping[str, Any],
        items: list[dict[str, Any]],
        columns: Mapping[str, str],
        empty: str,
    ) -> None:
        """Print many objects: as a JSON array, or as a table of `columns` (key -> header)."""
        if options["json"]:
            self.write_json(items)
        elif not items:
            self.stdout.write(empty)
        else:
            rows = ([item[key] for key in columns] for item in items)
            self.stdout.write(render_table(list(columns.values()), rows))
