"""Signals a host project can connect to, sent once the change is committed.

Every signal is sent from `transaction.on_commit`, so a receiver never sees a change that is
then rolled back, and a receiver that fails cannot undo the change (its exception propagates
to the caller after the commit, as Django's `on_commit` callbacks do). Receivers run in the
process and thread that made the change; hand slow work (mail, webhooks, cache warming) to a
queue.

Each signal's `sender` is the model class; the keyword arguments are listed per signal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction
from django.dispatch import Signal

#: An agent session was issued. `session` (AgentSession; its token is not available).
session_issued = Signal()

#: A session was revoked (sent once, by the call that revoked it). `session`.
session_revoked = Signal()

#: A document revision was written with its chunks: `document`, `outcome` ("created" or
#: "updated"), `chunks` (how many).
document_indexed = Signal()

#: A document was deleted: `knowledge_base`, `source_key`.
document_deleted = Signal()

#: A knowledge base was created or changed what searches see: `knowledge_base`, `change`
#: ("created", "enabled", "disabled", "language" or "embedder").
knowledge_base_changed = Signal()


def send_on_commit(signal: Signal, sender: type, **kwargs: Any) -> None:
    """Send `signal` after the current transaction commits (at once outside one)."""
    if not signal.has_listeners(sender):
        return
    send: Callable[[], Any] = lambda: signal.send(sender=sender, **kwargs)  # noqa: E731
    transaction.on_commit(send)
