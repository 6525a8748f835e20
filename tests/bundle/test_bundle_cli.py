"""Bundles through the real CLI: `prism run NAME.prism` answers as onnxruntime does, with
its partitions where the bundle (or `--remap`) put them; a truncated, corrupted, newer or
unmeetable bundle, or a bad `--remap`, is one line naming the file from `prism run`,
`prism tui` and `prism web` alike, before anything loads or any dashboard starts, and the
file is let go."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from app.cli import main
from runtime.bundle.reader import FORMAT_VERSION, MANIFEST, read_bundle
from tests.cli.test_cli import PRISM, _wide, one_line_error
from tests.support.bundles import case, file_is_open, rewrite
from tests.support.dags import SAMPLES_DIR

__all__ = ["_wide"]  # autouse: rich must not wrap the lines we read


@pytest.fixture(autouse=True)
def _no_dashboard(monkeypatch: pytest.MonkeyPatch) -> None:
    """A refused bundle must never get as far as a dashboard: one that starts fails the
    test (as an internal error) rather than taking the terminal or a port."""
    def started(*args: object) -> None:
        raise AssertionError("a dashboard started")

    monkeypatch.setattr("ui_tui.app.PrismApp.run", started)
    monkeypatch.setattr("app.web_cmd.free_port", started)


def test_run_takes_a_bundle_and_remaps_its_devices(capsys, tmp_path: Path) -> None:
    c = case("gpt2", 4, "balanced")
    schedule = c.compiled.manifest["schedule"]
    first, last = schedule[0]["device"], schedule[-1]["device"]
    record = tmp_path / "run.jsonl"
    assert main(["run", str(c.path), "--devices", "cpu:4", "--requests", "6", "--check",
                 "--remap", f"{first}={last}", "--remap", f"{last}={first}",
                 "--record", str(record)]) == 0
    out = capsys.readouterr().out
    assert "check: every output matches onnxruntime (6 answers" in out, out
    swap = {first: last, last: first}
    events = [json.loads(line) for line in record.read_text().splitlines()]
    ran = {(e["partition"], e["device"]) for e in events if e["kind"] == "partition.run.finished"}
    assert ran == {(r["partition"], swap.get(r["device"], r["device"])) for r in schedule}


def test_a_bundle_runs_without_devices_on_devices_like_its_own(capsys) -> None:
    """No --devices: a bundle runs on devices of the kinds and count it was compiled for;
    an ONNX model without --devices is one line."""
    c = case("mlp", 2, "balanced")
    for command in ("run", "bench"):
        assert main([command, str(c.path), "--requests", "4"]) == 0
        out = capsys.readouterr().out
        assert ("throughput" if command == "bench" else "requests") in out.lower(), out
    assert main(["run", str(c.path), "--requests", "4", "--check"]) == 0
    assert "check: every output matches onnxruntime (4 answers" in capsys.readouterr().out
    line = one_line_error(capsys, ["run", str(SAMPLES_DIR / "mlp.onnx")])
    assert "mlp.onnx: --devices SPEC is needed" in line, line


def _flipped(src: Path, dst: Path) -> Path:
    data = bytearray(src.read_bytes())
    with read_bundle(src) as bundle:
        start, size = bundle._members[MANIFEST]
    data[start + size // 2] ^= 0x5A
    dst.write_bytes(data)
    return dst


def _refusals(tmp_path: Path) -> list[tuple[Path, list[str], list[str]]]:
    """(bundle, flags, words its one-line error holds) for each way to be refused."""
    c = case("mlp", 2, "balanced")
    data = c.path.read_bytes()
    (tmp_path / "cut.prism").write_bytes(data[:len(data) // 2])
    newer = json.dumps({**c.compiled.manifest, "format_version": FORMAT_VERSION + 1})
    part = c.compiled.manifest["schedule"][0]["partition"]
    return [
        (tmp_path / "cut.prism", ["--devices", "cpu:2"], ["truncated"]),
        (_flipped(c.path, tmp_path / "flip.prism"), ["--devices", "cpu:2"],
         ["corrupted", MANIFEST]),
        (rewrite(c.path, tmp_path / "newer.prism", {MANIFEST: newer.encode()}),
         ["--devices", "cpu:2"], [f"format {FORMAT_VERSION + 1}", "newer"]),
        (c.path, ["--devices", "cpu:2:mem=1KB"], [f"partition {part}", "needs", "1.0 KB"]),
        (c.path, ["--devices", "sim:2"], [f"partition {part}", "no cpu device"]),
        (c.path, ["--devices", "cpu:1"], ["goes to another of the bundle's devices"]),
        (c.path, ["--devices", "cpu:2", "--remap", "cpu7=cpu0"], ["no device cpu7"]),
        (c.path, ["--devices", "cpu:2", "--remap", "cpu0=gpu0"], ["no device gpu0"]),
    ]


@pytest.mark.parametrize("command", ["run", "tui", "web"])
def test_a_bundle_that_cannot_load_is_one_line(command: str, capsys, tmp_path: Path) -> None:
    for path, flags, words in _refusals(tmp_path):
        line = one_line_error(capsys, [command, str(path), *flags])
        assert line.startswith("prism: error: "), line
        assert all(w in line for w in words) and path.name in line, (line, words)
        assert not file_is_open(path), path


def test_the_console_script_refuses_a_bundle_in_one_line(tmp_path: Path) -> None:
    """As a process: status 1, one line, nothing on stdout."""
    path = case("mlp", 2, "balanced").path
    done = subprocess.run([str(PRISM), "run", str(path), "--devices", "sim:2"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("prism: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert path.name in done.stderr and "no cpu device" in done.stderr
