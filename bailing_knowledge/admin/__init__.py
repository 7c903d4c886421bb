"""The Django admin for every model of the app: this module only registers the model admins.

Each model group has its module (`knowledge`, `routes`, `agents`, `tasks`); the forms,
actions and columns they share have theirs. Every action and form calls the services in
`bailing_knowledge.services`, so the admin applies exactly the rules the CLI and the
Python API apply.
"""

from django.contrib import admin

from ..models import AgentSession, Chunk, Client, Document, KnowledgeBase, Route, Run, Task
from .agents import AgentSessionAdmin, ClientAdmin
from .knowledge import ChunkAdmin, DocumentAdmin, KnowledgeBaseAdmin
from .routes import RouteAdmin
from .tasks import RunAdmin, TaskAdmin

admin.site.register(KnowledgeBase, KnowledgeBaseAdmin)
admin.site.register(Route, RouteAdmin)
admin.site.register(Client, ClientAdmin)
admin.site.register(AgentSession, AgentSessionAdmin)
admin.site.register(Document, DocumentAdmin)
admin.site.register(Chunk, ChunkAdmin)
admin.site.register(Task, TaskAdmin)
admin.site.register(Run, RunAdmin)
