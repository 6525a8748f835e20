"""Fuzz: mutated sample models through `prism partition` and `prism run --requests 2`.

Every outcome is a success with nothing on stderr, or exit status 1 with one line on
stderr, "prism: error: ..."; never a traceback, an internal error or a hang. The
mutations are fresh on every run; a failure prints the seed, and PRISM_FUZZ_SEED=<seed>
replays it. The cases run in one child process (`tests.support.mutants`), calling `main`
in-process with a bound per call, so a crash of a native library names its case
instead of taking pytest down.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

CASES = 300
CALL_SECONDS = 60.0  # a call takes well under a second; past this it hangs
TOTAL_SECONDS = 600.0  # all cases take about 10 s
ROOT = Path(__file__).resolve().parents[2]
DRIVER = "tests.support.mutants"  # run as a module from ROOT


def _judge(record: dict) -> str | None:
    """What is wrong with one call's outcome, or None."""
    lines = record["stderr"].strip().splitlines()
    if record["code"] == 0:
        return None if not lines else "succeeded but wrote to stderr"
    if record["code"] != 1:
        return f"exit status {record['code']}"
    if len(lines) != 1:
        return f"{len(lines)} lines on stderr"
    if not lines[0].startswith("prism: error: "):
        return "stderr is not a 'prism: error:' line"
    return None


def test_mutated_models_fail_in_one_line_or_succeed(tmp_path):
    seed = int(os.environ.get("PRISM_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
    try:
        child = subprocess.run([sys.executable, "-m", DRIVER, str(seed), str(CASES),
                                str(tmp_path), str(CALL_SECONDS)], capture_output=True,
                               text=True, timeout=TOTAL_SECONDS, cwd=ROOT)
        status, said = child.returncode, child.stderr[-3000:]
    except subprocess.TimeoutExpired:
        status, said = "timeout", ""
    replay = f"seed {seed} (PRISM_FUZZ_SEED={seed} replays it; files in {tmp_path})"
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    ended = [r for r in records if "start" not in r]
    if status != 0:
        last = records[-1] if records else {}
        how = "hung" if status in (3, "timeout") else f"died ({status})"
        raise AssertionError(f"{how} in case {last.get('case')}: {last.get('what')}: "
                             f"prism {' '.join(last.get('argv', []))}; {replay}\n{said}")
    bad = [(why, r) for r in ended if (why := _judge(r))]
    assert not bad, f"{len(bad)} bad outcomes, {replay}:\n" + "\n".join(
        f"case {r['case']} ({r['what']}): prism {' '.join(r['argv'])}: {why}\n"
        f"{r['stderr'][-1500:]}" for why, r in bad[:5])
    cases = {r["case"] for r in ended}
    assert len(cases) == CASES, replay
    ran = [r for r in ended if r["argv"][0] == "run"]
    # the mutations must reach the runtime, not only the checker: about a third plan
    assert len(ran) >= CASES // 10, f"only {len(ran)} mutants planned; {replay}"
