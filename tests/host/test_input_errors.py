"""Feeds the host refuses before anything runs: a wrong dtype, shape or name, or an input
missing or unknown, each one line saying what was expected and what was given."""

from __future__ import annotations

import numpy as np
import pytest

from runtime.devices import parse_devices
from runtime.errors import InvalidInputError
from runtime.host import HostManager
from tests.support.serving import MLP, WAIT, assert_same, expected, idle


def test_invalid_input_dtype_and_shape_say_expected_and_given():
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", MLP)
        good = np.zeros((2, 256), np.float32)
        messages = []
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"x": good.astype(np.float64)})
        assert "expected" in str(e.value) and "float32" in str(e.value)
        assert "float64" in str(e.value)
        messages.append(str(e.value))
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"x": np.zeros((2, 255), np.float32)})
        assert "expected" in str(e.value) and "256" in str(e.value) and "255" in str(e.value)
        messages.append(str(e.value))
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"x": np.zeros((2, 1, 256), np.float32)})
        assert "expected" in str(e.value)
        messages.append(str(e.value))
        with pytest.raises(InvalidInputError, match="missing"):
            host.run("mlp", {})
        with pytest.raises(InvalidInputError, match="'y'"):  # unknown beside a good one
            host.run("mlp", {"x": good, "y": good})
        assert all("\n" not in m for m in messages)
        assert idle(host)
        feeds = {"x": good + 1}
        assert_same(host.run("mlp", feeds).result(timeout=WAIT), expected(MLP, feeds))


def test_inputs_like_ones_accepted_before_are_still_checked_in_full():
    """An input's dtype and shape, once accepted, are remembered: what comes later in
    that shape must still be refused for a wrong dtype, name or extra input."""
    rng = np.random.default_rng()
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", MLP)
        good = rng.standard_normal((int(rng.integers(1, 4)), 256)).astype(np.float32)
        assert_same(host.run("mlp", {"x": good}).result(timeout=WAIT),
                    expected(MLP, {"x": good}))
        for bad, said in (({"x": good.astype(np.float64)}, "float64"), ({"y": good}, "'y'"),
                          ({"x": good, "y": good}, "'y'"), ({"x": good[:, :255]}, "255")):
            with pytest.raises(InvalidInputError, match=said):
                host.run("mlp", bad)
        assert idle(host)


def test_invalid_input_name_says_expected_and_given():
    with HostManager(parse_devices("cpu:1")) as host:
        host.add_network("mlp", MLP)
        with pytest.raises(InvalidInputError) as e:
            host.run("mlp", {"y": np.zeros((2, 256), np.float32)})
        message = str(e.value)
        assert "'x'" in message, message  # what it expects
        assert "'y'" in message, message  # what it was given
