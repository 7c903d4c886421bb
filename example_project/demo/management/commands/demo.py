"""Set up the demo (migrate, seed, admin user), print agent credentials, then serve."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import sys
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import transaction

from bailing_knowledge import services
from bailing_knowledge.ingestion.documents import upsert_document
from bailing_knowledge.ingestion.loaders import discover, load_file
from bailing_knowledge.models import AgentSession, Chunk, Client, KnowledgeBase, Route
from bailing_knowledge.retrieval.embedders import get_embedder

ROUTE_KEY = "demo"
KB_SLUG = "handbook"
APP_ID = "demo-agent"
DEVICE_LABEL = "make demo"
KNOWLEDGE_DIR = Path(__file__).resolve().parents[2] / "knowledge"


class Command(BaseCommand):
    help = "Migrate, seed an idempotent demo, print agent credentials and run the server."

    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("--addr", default="127.0.0.1:8000")
        parser.add_argument("--no-serve", action="store_true", help="Seed and print only.")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        addr = options["addr"]
        call_command("migrate", interactive=False, verbosity=0)
        issued = self.seed()
        password_note = self.ensure_admin()
        hub = f"http://{addr}"
        token = issued.access_token
        capabilities = f"{hub}/agent-api/v1/workspaces/{ROUTE_KEY}/knowledge/capabilities"
        search = f"{hub}/agent-api/v1/workspaces/{ROUTE_KEY}/knowledge/search"
        out = self.stdout.write
        out("")
        out(f"BAILING_HUB_URL={hub}")
        out(f"BAILING_ROUTE={ROUTE_KEY}")
        out(f"BAILING_ACCESS_TOKEN={token}")
        out("")
        mcp_config = {
            "mcpServers": {
                "bailing-knowledge": {
                    "command": sys.executable,
                    "args": ["-m", "bailing_knowledge.client"],
                    "env": {
                        "BAILING_HUB_URL": hub,
                        "BAILING_ROUTE": ROUTE_KEY,
                        "BAILING_ACCESS_TOKEN": token,
                    },
                }
            }
        }
        out("MCP host configuration (stdio):")
        out(json.dumps(mcp_config, indent=2))
        out("")
        out("Try it (in another terminal):")
        auth = shlex.quote("Authorization: Bearer " + token)
        out(f"  curl -s -H {auth} {capabilities}")
        # Shares no word with the refund policy, which comes first all the same (WordLlama).
        query = shlex.quote('{"query": "money back"}')
        out(f"  curl -s -H {auth} -H 'Content-Type: application/json' -d {query} {search}")
        out("")
        out(f"Admin: {hub}/admin/  {password_note}")
        out("The token above replaces the one printed by any earlier run (those are revoked).")
        out("")
        if not options["no_serve"]:
            call_command("runserver", addr, use_reloader=False)

    @transaction.atomic
    def seed(self) -> services.IssuedSession:
        kb = KnowledgeBase.objects.filter(slug=KB_SLUG).first() or services.create_knowledge_base(
            KB_SLUG, title="Demo handbook"
        )
        route = Route.objects.filter(route_key=ROUTE_KEY).first() or services.create_route(
            ROUTE_KEY, name="Demo workspace", knowledge_bases=[kb]
        )
        client = Client.objects.filter(app_id=APP_ID).first() or services.create_client(
            APP_ID, name="Demo agent", routes=[route]
        )
        # Vectors of another size come from an earlier embedder setting: embed them again.
        chunks = Chunk.objects.filter(knowledge_base=kb)
        if chunks.exclude(embedding_dimensions=get_embedder(kb.embedder).dimensions).exists():
            services.reindex_knowledge_base(kb)
        for item in discover([KNOWLEDGE_DIR]):
            loaded = load_file(item.path, source_key=item.source_key)
            upsert_document(kb, item.source_key, loaded.title, loaded.body, loaded.metadata)
        # Each run hands out a fresh token; the previous demo sessions stop working.
        for session in AgentSession.objects.filter(
            client=client, device_label=DEVICE_LABEL, revoked_at__isnull=True
        ):
            services.revoke_session(session)
        return services.issue_session(
            client,
            principal_id="demo-user",
            routes=[route],
            lifetime=timedelta(days=1),
            device_label=DEVICE_LABEL,
        )

    def ensure_admin(self) -> str:
        """Create the `admin` superuser on first run and remember its password locally."""
        default = Path(settings.REPO_DIR) / ".data" / "demo-admin-password"
        password_file = Path(os.environ.get("DEMO_ADMIN_PASSWORD_FILE") or default)
        user_model = get_user_model()
        if not user_model.objects.filter(username="admin").exists():
            password = secrets.token_urlsafe(12)
            user_model.objects.create_superuser("admin", "admin@example.com", password)
            password_file.parent.mkdir(parents=True, exist_ok=True)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        if password_file.exists():
            return f"user 'admin', password '{password_file.read_text().strip()}'"
        return (
            "user 'admin' exists; set a password with "
            "`.venv/bin/python example_project/manage.py changepassword admin`"
        )
