"""Which run a request may act within: the run rules shared by search, read and delivery."""

from __future__ import annotations

from ..access import task_admits
from ..exceptions import RunNotCurrent
from ..models import AgentSession, Route, Run


def current_run(
    session: AgentSession, route: Route, run_id: str, *, allow_preparing: bool = False
) -> Run:
    """The run `run_id` if it is current for this session, client and route.

    Current means: owned by this session, its client and this route; `context_ready` (or
    `preparing`, for server-side preparation only); and, when bound to a task, the task is
    active and the session still one of its members. Anything else is `run_not_current`,
    one answer for every cause.
    """
    run = (
        Run.objects.select_related("task")
        .filter(run_id=run_id, session=session, client_id=session.client_id, route=route)
        .first()
    )
    states = {Run.State.CONTEXT_READY} | ({Run.State.PREPARING} if allow_preparing else set())
    if run is None or run.state not in states or not task_allows(run, session):
        raise RunNotCurrent()
    return run


def task_allows(run: Run, session: AgentSession) -> bool:
    """Whether the run's task, if it has one, lets `session` go on with it (`task_admits`);
    the run's `task` is loaded with it, or fetched here."""
    return run.task_id is None or task_admits(run.task, session)
