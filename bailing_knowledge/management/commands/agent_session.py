"""`manage.py agent_session`: issue, list and revoke agent sessions from the shell.

Hosts normally issue sessions from their own consent page; this command covers the cases with
no such page (service accounts, tests, incident response). The bearer token is printed once,
when it is issued, and is never stored: `list` shows only the non-secret `token_hint`.
"""

from __future__ import annotations

import argparse
from typing import Any

from django.utils import timezone

from bailing_knowledge import services
from bailing_knowledge.management.base import (
    ServiceCommand,
    iso,
    lifetime,
    render_fields,
    session_data,
)
from bailing_knowledge.models import AgentSession

COLUMNS = {
    "session_id": "SESSION_ID",
    "client": "CLIENT",
    "principal_id": "PRINCIPAL",
    "tenant": "TENANT",
    "routes": "ROUTES",
    "token_hint": "HINT",
    "expires_at": "EXPIRES_AT",
    "status": "STATUS",
}


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    """Lift the principal's fields to the top level, for tables and field lists."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "principal":
            flat.update(
                principal_id=value["id"],
                tenant=value["tenant"],
                roles=value["roles"],
                audience=value["audience"],
            )
        else:
            flat[key] = value
    return flat


class Command(ServiceCommand):
    help = "Issue, list and revoke agent sessions (bearer tokens for one principal)."

    field_options = {
        "client": "APP_ID",
        "principal_id": "--principal",
        "principal_tenant": "--tenant",
        "principal_roles": "--role",
        "principal_audience": "--audience",
        "on_behalf_of": "--on-behalf-of",
        "routes": "--route",
        "lifetime": "--lifetime",
        "device_label": "--device-label",
    }

    def add_subcommands(self, subparsers: argparse._SubParsersAction) -> None:
        issue = self.add_subcommand(
            subparsers, "issue", "Issue a session and print its bearer token once."
        )
        issue.add_argument(
            "app_id",
            metavar="APP_ID",
            help="The agent client the session is issued to.",
        )
        issue.add_argument("--principal", required=True, help="Id of the business principal.")
        issue.add_argument("--tenant", default="", help="The principal's tenant.")
        issue.add_argument(
            "--role", action="append", default=[], help="A principal role; repeat for several."
        )
        issue.add_argument("--audience", default="", help="The principal's audience.")
        issue.add_argument(
            "--on-behalf-of", default="", help="Who the agent acts for, if not the principal."
        )
        issue.add_argument(
            "--route",
            action="append",
            required=True,
            metavar="KEY",
            help="A route the session may use (among the client's routes); repeat for several.",
        )
        issue.add_argument(
            "--lifetime",
            type=lifetime,
            help="Seconds, or a number with s/m/h/d/w such as 30m, 8h or 7d "
            "(default: SESSION_DEFAULT_LIFETIME).",
        )
        issue.add_argument("--device-label", default="", help="Where the token will live.")

        listing = self.add_subcommand(subparsers, "list", "List sessions, newest first.")
        listing.add_argument("--client", metavar="APP_ID", help="Only sessions of this client.")
        listing.add_argument("--principal", help="Only sessions of this principal id.")
        listing.add_argument("--route", metavar="KEY", help="Only sessions allowed on this route.")
        state = listing.add_mutually_exclusive_group()
        state.add_argument(
            "--active",
            dest="active",
            action="store_const",
            const=True,
            help="Only unrevoked, unexpired sessions.",
        )
        state.add_argument(
            "--inactive",
            dest="active",
            action="store_const",
            const=False,
            help="Only revoked or expired sessions.",
        )

        revoke = self.add_subcommand(subparsers, "revoke", "Revoke a session (idempotent).")
        revoke.add_argument("session_id", metavar="SESSION_ID")

    def handle_issue(self, **options: Any) -> None:
        issued = services.issue_session(
            options["app_id"],
            principal_id=options["principal"],
            routes=options["route"],
            tenant=options["tenant"],
            roles=options["role"],
            audience=options["audience"],
            on_behalf_of=options["on_behalf_of"],
            lifetime=options["lifetime"],
            device_label=options["device_label"],
        )
        data = session_data(issued.session)
        warning = issued.refused_routes_warning()
        if warning is not None:  # stderr: stdout stays the record (or the JSON) alone
            self.stderr.write(self.style.WARNING(f"Warning: {warning}"))
        if options["json"]:
            self.write_json(
                {
                    "session_id": issued.session_id,
                    "access_token": issued.access_token,
                    "expires_at": iso(issued.expires_at),
                    "session": data,
                }
            )
            return
        self.stdout.write(self.style.SUCCESS(f"Issued session {issued.session_id}."))
        self.stdout.write(render_fields(_flat(data)))
        self.stdout.write(
            self.style.WARNING("Access token (store it now: it will not be shown again):")
        )
        self.stdout.write(issued.access_token)

    def handle_list(self, **options: Any) -> None:
        sessions = services.list_sessions(
            client=options["client"],
            principal_id=options["principal"],
            route=options["route"],
            active=options["active"],
        )
        now = timezone.now()
        items = [session_data(session, now) for session in sessions]
        if options["json"]:
            self.write_json(items)
        else:
            self.write_list(options, [_flat(item) for item in items], COLUMNS, "No sessions.")

    def handle_revoke(self, **options: Any) -> None:
        session: AgentSession = services.revoke_session(options["session_id"])
        data = session_data(session)
        if options["json"]:
            self.write_json(data)
            return
        self.stdout.write(
            self.style.SUCCESS(
                f"Session {session.session_id} revoked at {iso(session.revoked_at)}."
            )
        )
