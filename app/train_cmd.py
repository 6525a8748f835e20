"""`prism train MODEL --data DATA.npz --labels NAME --devices SPEC -o TRAINED.onnx ...`:
train a model from its current weights over the devices, pipelined (`runtime.train`), and
write it back as a plain inference model.

A progress bar shows the loss as it trains; then a table per epoch and one per stage
(device, peak activations held), with the measured step time against the schedule's
ideal and the bubble; `--json` prints one object instead. `--tui` trains under the
terminal dashboard and `--web` under the browser one (the run then happens in the
Streamlit process, which writes `-o` when it ends). Nothing is written unless every
epoch ran.
"""

from __future__ import annotations

import argparse
import json
import os

from rich import box
from rich.table import Table

from app.console import plain_console, progress_on
from app.train_run import TrainingRun, TrainSettings
from runtime.train.pipeline import StepReport
from runtime.units import human_bytes, human_seconds


def settings_of(args: argparse.Namespace) -> TrainSettings:
    return TrainSettings(model=args.model, data=args.data, labels=args.labels,
                         devices=args.devices, output=args.output, loss=args.loss,
                         optimizer=args.optimizer, lr=args.lr, batch_size=args.batch_size,
                         micro_batches=args.micro_batches, epochs=args.epochs,
                         schedule=args.schedule, seed=args.seed)


def run(args: argparse.Namespace) -> int:
    settings = settings_of(args)
    if args.web:
        return _on_web(settings, args.port)
    training = TrainingRun(settings)
    try:
        if args.tui:
            _on_tui(training)
        else:
            _with_progress(training, quiet=args.json)
    finally:
        training.close()
    if training.error is not None:
        raise training.error
    if training.result is None or not training.result.complete:
        plain_console(stderr=True).print("prism train: stopped before the last epoch; "
                                         "nothing written")
        return 1
    if args.json:
        print(json.dumps(training.summary(), indent=2))
    else:
        _print(training)
    return 0


def _with_progress(training: TrainingRun, quiet: bool) -> None:
    trainer = training.trainer
    total = trainer.steps_per_epoch * trainer.config.epochs
    bar = progress_on(plain_console(stderr=True), quiet=quiet)
    with bar:
        task = bar.add_task(f"training {trainer.name}", total=total)

        def on_step(epoch: int, report: StepReport) -> None:
            bar.update(task, advance=1, description=f"epoch {epoch}/{trainer.config.epochs}"
                                                    f"  loss {report.loss:.4f}")

        training.run_here(on_step)


def _on_tui(training: TrainingRun) -> None:
    from app.train_source import TrainingSource
    from app.tui_cmd import show

    show(TrainingSource(training))  # quitting closes the source, which stops the run


def _on_web(settings: TrainSettings, port: int) -> int:
    """The Streamlit dashboard with the training running inside it (`prism web`'s
    launcher, the settings handed over through the environment)."""
    from app.sources import SourceSettings
    from app.web_cmd import serve

    TrainingRun(settings).trainer.close()  # bad settings fail here, as one line
    env = SourceSettings(train=settings.to_json()).to_env(os.environ)
    return serve(env, port)


def _print(training: TrainingRun) -> None:
    result, trainer = training.result, training.trainer
    assert result is not None
    console = plain_console()
    epochs = Table(box=box.SIMPLE_HEAD, title=f"{trainer.name}: {trainer.config.loss}, "
                   f"{trainer.config.optimizer.kind} at {trainer.config.optimizer.lr:g}")
    for column in ("epoch", "loss", "steps", "time"):
        epochs.add_column(column, justify="right")
    for e in result.epochs:
        epochs.add_row(str(e.epoch), f"{e.loss:.4f}", str(e.steps), human_seconds(e.seconds))
    console.print(epochs)
    stages = Table(box=box.SIMPLE_HEAD, title=f"{result.stages} stages, {result.schedule}, "
                   f"{result.micro_batches} micro-batches of {trainer.config.micro_size}")
    for column in ("stage", "partition", "device", "peak activations"):
        stages.add_column(column, justify="right" if column == "peak activations" else "left")
    for stage, peak in zip(trainer.pipeline.stages, result.peak_activation_bytes, strict=True):
        stages.add_row(str(stage.index), stage.partition, stage.device, human_bytes(peak))
    console.print(stages)
    console.print(f"step {human_seconds(result.step_seconds)} measured (median), "
                  f"{human_seconds(result.ideal_step_seconds)} ideal for the schedule; "
                  f"bubble {result.bubble:.1%} of device time")
    if training.saved:
        console.print(f"trained model -> {training.saved}")
