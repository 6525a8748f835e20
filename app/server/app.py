"""The ASGI app: routes gathered from one module per job, every one behind the guard
(token, body limit) and the protocol's error responses; inference requests reach their
route first, past Starlette (`infer.HotRoute`).

A route module has `routes(state) -> list[BaseRoute]`; adding an endpoint is adding a
module to `ROUTE_MODULES` (or passing `modules`).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.types import ASGIApp

from app.server.errors import HANDLERS
from app.server.guard import HEALTH_PATHS, Guard, ReadBeforeAnswer
from app.server.routes import health, infer, metrics, models, repository, watch
from app.server.state import ServerState

ROUTE_MODULES: tuple[ModuleType, ...] = (infer, health, models, repository, metrics, watch)


def create_app(state: ServerState, modules: Sequence[ModuleType] = ROUTE_MODULES) -> ASGIApp:
    settings = state.settings
    open_paths = HEALTH_PATHS if settings.open_health else frozenset()
    app = Starlette(routes=[route for module in modules for route in module.routes(state)],
                    middleware=[Middleware(ReadBeforeAnswer,
                                           max_body_bytes=settings.max_body_bytes),
                                Middleware(Guard, token=settings.token,
                                           max_body_bytes=settings.max_body_bytes,
                                           open_paths=open_paths)],
                    exception_handlers=HANDLERS)
    app.state.prism = state
    return infer.HotRoute(state, app) if infer in modules else app
