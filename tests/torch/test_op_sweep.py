"""The committed qualification table (tests/torch/op_sweep.json, made by
`python -m tests.torch.sweep`, shown in docs/torch_ops.md) holds, and still holds: no
operator is wrong, and a fresh random sample of its operators, rerun now, comes out as
the table says. The whole sweep takes most of an hour; the sample, seconds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from runtime.torch.options import OffloadOptions
from tests.torch.sweep import OUTCOMES, TABLE, check_op, op_db, op_key

# outcomes -> operators rerun per run
SAMPLE = {"offloaded": 2, "partly": 1, "fell back": 1}


@pytest.fixture(scope="module")
def table() -> dict:
    return json.loads(TABLE.read_text())


@pytest.fixture(scope="module")
def database() -> dict:
    return {op_key(op): op for op in op_db()}


def test_the_table_is_whole_and_nothing_is_wrong(table, database):
    results = table["ops"]
    assert set(results) == set(database), "rerun python -m tests.torch.sweep"
    assert sum(table["counts"].values()) == len(results)
    assert {r["outcome"] for r in results.values()} <= set(OUTCOMES)
    wrong = {k: r for k, r in results.items() if r["outcome"] in ("wrong", "error")}
    assert not wrong, wrong
    assert set(table["versions"]) >= {"torch", "onnxscript", "onnxruntime"}


# torch's own samples call operators torch deprecates (scatter's reduce, cholesky)
@pytest.mark.filterwarnings("ignore:.*(is deprecated|deprecated in favor):UserWarning")
def test_a_fresh_sample_of_operators_comes_out_as_the_table_says(table, database, host):
    rng = np.random.default_rng()
    options = OffloadOptions.of({"host": host})
    for outcome, count in SAMPLE.items():
        keys = sorted(k for k, r in table["ops"].items() if r["outcome"] == outcome)
        for key in rng.choice(keys, size=min(count, len(keys)), replace=False):
            result = check_op(database[key], options)
            assert result.outcome == outcome, (key, result, table["ops"][key])
