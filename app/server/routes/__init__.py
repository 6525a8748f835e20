"""One module per job, each with `routes(state) -> list[BaseRoute]` (see app.server.app)."""
