"""The output check every stage of every request passes: what it accepts, and that an
output seen before takes the short pass (one set lookup), also when its dtype is equal to
the declared one without being the same object (onnxruntime's int64 is numpy's
longlong)."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.executor.checks import OutputCheck
from runtime.inputs import InputSpec, array_text


def _check() -> OutputCheck:
    return OutputCheck([InputSpec("ids", np.dtype(np.int64), ("batch", 4)),
                        InputSpec("x", np.dtype(np.float32), (2, None))])


def _outputs(rng: np.random.Generator, ids_dtype: str = "q") -> dict[str, np.ndarray]:
    return {"ids": rng.integers(0, 100, (int(rng.integers(1, 5)), 4)).astype(ids_dtype),
            "x": rng.standard_normal((2, 3)).astype(np.float32)}


def test_an_equal_dtype_of_another_object_takes_the_short_pass(monkeypatch):
    rng = np.random.default_rng()
    check, outputs = _check(), _outputs(rng)
    assert outputs["ids"].dtype == np.int64 and outputs["ids"].dtype is not np.dtype(np.int64)
    assert check.problem(outputs) is None  # the first sight of these shapes: the long pass
    monkeypatch.setattr(OutputCheck, "_problem", lambda self, out: pytest.fail("long pass"))
    assert check.problem(dict(outputs)) is None


def test_wrong_outputs_are_named():
    rng = np.random.default_rng()
    check = _check()
    assert check.problem(_outputs(rng)) is None
    wrong = _outputs(rng, ids_dtype="int32")
    assert check.problem(wrong) == f"output 'ids' is {array_text(wrong['ids'])}, declared " \
                                   f"int64 [batch, 4]"
    assert check.problem({"x": _outputs(rng)["x"]}) == "output 'ids' is missing"
    bad = _outputs(rng)
    bad["x"] = bad["x"][:, :, None]
    assert "output 'x' is float32 [2, 3, 1]" in check.problem(bad)
