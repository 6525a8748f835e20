"""A model repository on disk, laid out as Triton's or flat:

    DIR/NAME/VERSION/model.onnx | model.prism   (plus an optional DIR/NAME/config.pbtxt)
    DIR/NAME.onnx | DIR/NAME.prism              (version "1")

Models load only from inside DIR: a name is one plain path segment, and every file is
resolved (symbolic links followed) and refused unless it lies inside DIR's own resolved
path, so neither `..`, an absolute path nor a link out of the repository reaches a file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.server import pbtxt
from app.server.load_options import ConfigTensor
from runtime.errors import NetworkNotFoundError, PrismError

FILES = ("model.onnx", "model.prism")
SUFFIXES = (".onnx", ".prism")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


class RepositoryError(PrismError):
    """A model name or file the repository refuses."""


@dataclass(frozen=True)
class Entry:
    """One model the repository holds: its versions (version -> file) and its config."""

    name: str
    versions: dict[str, Path]
    config: dict[str, Any] = field(default_factory=dict)


class ModelRepository:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise RepositoryError(f"model repository {root} is not a directory")

    def names(self) -> list[str]:
        """Every model name the repository holds, sorted."""
        found = {p.name if p.is_dir() else p.stem for p in self.root.iterdir()}
        return sorted(n for n in found if _NAME.fullmatch(n) and self._versions(n))

    def get(self, name: str) -> Entry:
        if not _NAME.fullmatch(name) or not name.strip("."):
            raise RepositoryError(f"model name {name!r} is not a plain name (letters, digits, "
                                  f"'_', '-', '.'; no path)")
        versions = self._versions(name)
        if not versions:
            raise NetworkNotFoundError(f"model {name!r} is not in the repository "
                                       f"{self.root} (it holds {', '.join(self.names())})"
                                       f"{self.linked_out(name)}")
        config = self.root / name / "config.pbtxt"
        return Entry(name, versions, self._config(config) if config.is_file() else {})

    def outside(self) -> list[Path]:
        """What is laid out as a model (a folder, a NAME.onnx or NAME.prism, a version's
        folder or model file) but links out of the repository: refused, and named, so
        nobody wonders where a model went."""
        entries = [p for p in self.root.iterdir() if (p.is_dir() or p.suffix in SUFFIXES)
                   and _NAME.fullmatch(p.name if p.is_dir() else p.stem)]
        versions = [v for p in entries if p.is_dir() and self._inside(p) for v in p.iterdir()
                    if v.is_dir() and v.name.isdigit()]
        files = [f for v in versions if self._inside(v) for f in (v / n for n in FILES)
                 if f.is_file()]
        return sorted(p for p in entries + versions + files if not self._inside(p))

    def linked_out(self, name: str) -> str:
        """Where the entry named `name` that links out of the repository (or a version of
        it) leads, as the end of a message; "" if none does."""
        return next((f"; {p} links out of it, to {p.resolve()}" for p in self.outside()
                     if name in (top := p.relative_to(self.root).parts[0],
                                 Path(top).stem)), "")

    def _versions(self, name: str) -> dict[str, Path]:
        folder = self.root / name
        if folder.is_dir() and self._inside(folder):
            versions = {v.name: f for v in folder.iterdir() if v.is_dir() and v.name.isdigit()
                        for f in [self._model_file(v)] if f is not None}
            if versions:
                return versions
        for suffix in SUFFIXES:
            path = self.root / f"{name}{suffix}"
            if path.is_file() and self._inside(path):
                return {"1": path.resolve()}
        return {}

    def _model_file(self, version: Path) -> Path | None:
        for file in FILES:
            path = version / file
            if path.is_file() and self._inside(path):
                return path.resolve()
        return None

    def labels(self, name: str, tensors: Iterable[ConfigTensor]) -> dict[str, tuple[str, ...]]:
        """Output -> its class labels, one a line of the file its configuration's
        `label_filename` names in the model's folder (Triton's classification extension)."""
        out = {}
        for tensor in tensors:
            if tensor.label_filename is None:
                continue
            path = self._in_folder(name, tensor.label_filename)
            try:
                out[tensor.name] = tuple(path.read_text(encoding="utf-8").splitlines())
            except (OSError, UnicodeDecodeError) as exc:
                raise RepositoryError(f"model {name!r}: cannot read the labels of output "
                                      f"{tensor.name!r}: {exc}") from None
        return out

    def warmup_file(self, name: str, file: str, most: int) -> bytes:
        """A warmup sample's data: `file` in the model's `warmup/` folder, as Triton keeps
        it; refused unread past `most` bytes."""
        path = self._in_folder(name, "warmup", file)
        try:
            size = path.stat().st_size
            if size > most:
                raise RepositoryError(f"model {name!r}: warmup file {file} holds {size} "
                                      f"bytes, more than the {most} its input takes")
            return path.read_bytes()
        except OSError as exc:
            raise RepositoryError(f"model {name!r}: cannot read warmup file {file}: "
                                  f"{exc.strerror or exc}") from None

    def _in_folder(self, name: str, *parts: str) -> Path:
        """A file of model `name`'s folder that a configuration names, refused if it leads
        out of the repository."""
        path = self.root.joinpath(name, *parts)
        if not self._inside(path):
            raise RepositoryError(f"{path} leads out of the model repository")
        return path

    def _inside(self, path: Path) -> bool:
        return path.resolve().is_relative_to(self.root)

    def _config(self, path: Path) -> dict[str, Any]:
        if not self._inside(path):
            raise RepositoryError(f"{path} leads out of the model repository")
        try:
            return pbtxt.parse(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise RepositoryError(f"cannot read {path}: {exc}") from None
