"""`prism serve`: one HostManager behind the Open Inference Protocol over HTTP, until Ctrl-C
or SIGTERM: it then stops accepting, lets requests in flight finish for `--grace-seconds`,
answers the rest 503, writes `--trace`, closes the host and its devices, and exits 0."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from app.arguments import output_file, writing
from app.console import plain_console, progress_on
from app.server.app import create_app
from app.server.load_options import load_options
from app.server.protocol import Limits
from app.server.repository import SUFFIXES, ModelRepository
from app.server.runner import PrismServer, bind, check_exposure, server, url
from app.server.state import ServerSettings, ServerState
from runtime.devices import parse_devices
from runtime.errors import PrismError
from runtime.host import HostManager
from runtime.observe.trace import ChromeTrace
from runtime.units import human_bytes

TOKEN_VARIABLE = "PRISM_TOKEN"  # the token, kept off the command line (and out of `ps`)
CLOSE_SECONDS = 5.0  # after the drain: the host's last requests end or fail within this


def run(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    check_exposure(args.host, token, args.insecure)
    devices = parse_devices(args.devices)
    repository = ModelRepository(args.model_repository) if args.model_repository else None
    wanted = _wanted(args.models, repository)
    for skipped in repository.outside() if repository is not None and not args.models else ():
        sys.stderr.write(f"prism: skipped {skipped}: it links out of the model repository, to "
                         f"{skipped.resolve()} (models load only from inside it)\n")
    params = _parameters(args)
    trace_path = output_file(args.trace, "--trace") if args.trace else None
    limits = Limits(header_timeout=args.header_timeout, body_timeout=args.body_timeout,
                    max_connections=args.max_connections, grace_seconds=args.grace_seconds)
    sock = bind(args.host, args.port)  # before loading: a taken port fails at once
    console = plain_console()
    with HostManager(devices, max_queue=args.max_queue) as host, _term_interrupts():
        state = ServerState.open(host, repository, ServerSettings(
            token, max(1, int(args.max_body_mb * (1 << 20))), args.devices,
            open_health=not args.health_needs_token))
        if trace_path is not None:
            state.trace = ChromeTrace(host.bus)  # before the loads: their memory too
        try:
            with progress_on(plain_console(stderr=True),
                             description="loading {task.description}") as progress:
                task = progress.add_task("models", total=len(wanted))
                for name, path in wanted:
                    progress.update(task, description=name)
                    if path is None:
                        state.catalog.load(name, params)
                    else:
                        state.catalog.add(name, path, load_options({}, params))
                    progress.advance(task)
            state.ready = True
            started = Group(_table(state), Text.assemble(
                "Serving the Open Inference Protocol on ", (url(sock), "bold"),
                " (/v2, /metrics)", "" if token else ", no token",
                "; Ctrl-C or SIGTERM stops it."))
            serving = server(create_app(state), limits, _stopping(state))
            with serving.capture_signals():  # from the moment it says it serves
                console.print(started)
                serving.run(sockets=[sock])
        finally:
            if trace_path is not None and state.trace is not None:
                taken, plans = state.trace, state.plans()
                writing(trace_path, "--trace", lambda: taken.write(trace_path, plans))
            state.close()
            sock.close()
            host.close(CLOSE_SECONDS)
    return 0


@contextlib.contextmanager
def _term_interrupts() -> Iterator[None]:
    """SIGTERM interrupts as Ctrl-C does while models load (the server, once it runs,
    drains on either), in place of any handler before (Ray's exits with status 15)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _stopping(state: ServerState) -> Callable[[PrismServer], None]:
    """What a stop does first: health says not ready, event streams end, a line says so."""

    def stop(server: PrismServer) -> None:
        state.ready, state.closing = False, True
        waiting = len(server.server_state.tasks)
        sys.stderr.write(f"prism: {server.stopped_by or 'stopping'}: no new connections"
                         + (f"; the {waiting} in flight get up to "
                            f"{server.limits.grace_seconds:g} s" if waiting else "") + "\n")
        sys.stderr.flush()

    return stop


def _wanted(models: list[str], repository: ModelRepository | None
            ) -> list[tuple[str, Path | None]]:
    """(name, file) per MODEL: a model file, or (name, None) for a repository model; with
    no MODEL, every model in the repository."""
    if not models:
        if repository is None:
            raise PrismError("nothing to serve: give MODEL files, or --model-repository DIR")
        return [(name, None) for name in repository.names()]
    out: dict[str, Path | None] = {}
    for model in models:
        path = Path(model)
        if path.suffix in SUFFIXES and path.is_file():
            name, found = path.stem, path.resolve()
        elif repository is not None and model in repository.names():
            name, found = model, None
        else:
            where = f" nor a model in {repository.root}{repository.linked_out(model)}" \
                if repository else ""
            hint = (f" (a folder: serve a model repository with --model-repository {model})"
                    if path.is_dir() and repository is None else "")
            raise PrismError(f"MODEL {model!r} is not an .onnx or .prism file{where}{hint}")
        if name in out:
            raise PrismError(f"two models are named {name!r}; serve one of them")
        out[name] = found
    return list(out.items())


def _parameters(args: argparse.Namespace) -> dict:
    """The command line's load parameters, applied to every model loaded at start."""
    params: dict = {}
    if args.partition:
        params["partition"] = args.partition
    if args.max_batch:
        params.update(max_batch_size=args.max_batch, max_queue_delay_ms=args.max_delay_ms)
    if args.replicas not in (None, 1):
        params["replicas"] = args.replicas
    if args.costs:
        params["costs"] = args.costs
    return params


def _table(state: ServerState) -> Table:
    table = Table(title="Models", box=box.SIMPLE_HEAD)
    for col in ("model", "version", "partitions", "devices", "weights", "batching",
                "replicas", "file"):
        table.add_column(col)
    for served in state.catalog.served():
        plan = state.host.plan(served.network)
        batch = served.options.max_batch_size
        table.add_row(served.name, served.version, str(len(plan.partitions)),
                      ", ".join(name for name, _ in served.devices),
                      human_bytes(sum(p.weight_bytes for p in plan.partitions)),
                      f"max {batch}" if batch else "off", str(state.host.replicas(served.network)),
                      str(served.source))
    return table
