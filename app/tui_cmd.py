"""`prism tui`: the terminal dashboard on an embedded runtime, or on a recorded run."""

from __future__ import annotations

import argparse
import sys

from app.dashboard import DashboardModel, RuntimeSource
from app.hangup import exit_on_hangup
from app.sources import SourceSettings


def run(args: argparse.Namespace) -> int:
    return show(SourceSettings(
        args.model, args.devices, args.partition, rate=args.rate, concurrency=args.concurrency,
        seed=args.seed, replay=args.replay, connect=args.connect, token=args.token,
        remap=",".join(args.remap) or None, inputs=args.inputs,
        bind=",".join(args.bind) or None).open())


def show(source: RuntimeSource) -> int:
    """The terminal dashboard on `source` until it quits (`prism train --tui` too)."""
    from ui_tui import PrismApp  # the launcher: Textual loads only for this command

    model = DashboardModel(source)
    if sys.stdin.isatty():
        exit_on_hangup(sys.stdin.fileno())
    try:
        app = PrismApp(model)
        result = app.run()
    finally:
        model.close()  # a no-op when `q` already closed it
    return result if result is not None else (app.return_code or 0)
