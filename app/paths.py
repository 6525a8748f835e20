"""Files a command will write, checked before it does any work (`check_outputs`, from
`app.cli.main`, for every command): each must be a file in a folder that exists, one this
process can create or write (so `--trace /proc/x.json` is refused at once, not when the
trace is written at the end), and none may be a file the command reads, however it is
reached (the same path, a symbolic link, a hard link), nor another of its outputs: a
command never destroys its own input.

Standard library only: it runs before the command's modules load.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from pathlib import Path

# argparse dest -> the flag a message names; dests a command reads a file or folder from
OUTPUTS = {"output": "-o", "dot": "--dot", "record": "--record", "trace": "--trace"}
INPUTS = {"model": "the model", "bundle": "the bundle", "models": "the model",
          "inputs": "--inputs", "annotate": "--annotate", "partition": "--partition",
          "devices": "--devices", "profile": "--profile", "calibrate": "--calibrate",
          "replay": "--replay", "model_repository": "--model-repository",
          "data": "--data"}


class OutputError(Exception):
    """An output file a command cannot, or must not, write (a one-line message)."""


def check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before anything runs, an output that cannot be written or is an input."""
    outputs = [(OUTPUTS[dest], Path(value)) for dest, value in vars(args).items()
               if dest in OUTPUTS and isinstance(value, str) and value]
    for i, (flag, path) in enumerate(outputs):
        writable(path, flag)
        for what, source in _inputs(args):
            if _same(path, source) or (source.is_dir() and path.exists()
                                       and path.resolve().is_relative_to(source.resolve())):
                raise OutputError(f"{flag} {path} would overwrite {what} {source}, which "
                                  f"this command reads; write to another file")
        for other_flag, other in outputs[:i]:
            if path.resolve() == other.resolve() or _same(path, other):
                raise OutputError(f"{flag} and {other_flag} both name {path}; give each "
                                  f"its own file")


def writable(path: Path, flag: str) -> Path:
    """`path`, if this process can write a file there (a new one is created and removed
    to find out), else OutputError naming the flag and why."""
    try:
        if path.is_dir():
            raise OutputError(f"{flag} {path} is a folder; give a file name")
        if not path.parent.is_dir():
            raise OutputError(f"{flag} {path}: there is no folder {path.parent}")
        if path.exists():
            if path.is_file():  # not a device or a pipe: opening those may block or act
                os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            path.unlink()
    except OSError as exc:
        raise OutputError(f"{flag} {path}: cannot write there: {exc.strerror or exc}") from None
    return path


def _inputs(args: argparse.Namespace) -> Iterator[tuple[str, Path]]:
    for dest, what in INPUTS.items():
        values = getattr(args, dest, None)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str) and value:
                path = Path(value)
                try:
                    if path.exists():
                        yield what, path
                except OSError:  # a name too long, say: not a file anything reads
                    continue


def _same(a: Path, b: Path) -> bool:
    """Are `a` and `b` one file (links followed, hard links found by device and inode)?"""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
