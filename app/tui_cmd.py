"""`prism tui`: the terminal dashboard on an embedded runtime, or on a recorded run."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.live import LiveRuntime
from runtime.errors import PrismError


def run(args: argparse.Namespace) -> int:
    from ui_tui import PrismApp  # Textual loads only for this command

    if args.replay is not None and not Path(args.replay).is_file():
        raise PrismError(f"--replay: no such file: {args.replay}")
    live = LiveRuntime(args.model, args.devices, args.partition, rate=args.rate,
                       concurrency=args.concurrency, replay_file=args.replay, seed=args.seed)
    try:
        app = PrismApp(live, replay=args.replay)
        result = app.run()
    finally:
        live.close()  # a no-op when `q` already closed it
    return result if result is not None else (app.return_code or 0)
