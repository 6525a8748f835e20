"""A bundle answers bit for bit what the just-in-time path answers (HostManager), run by
the driver under every policy and loaded into a HostManager, for every sample and real
model, on 1 to 4 cpu devices, in every partition mode. Each bundle is compiled once and
shared by the driver's three policies and the host's case."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from runtime.driver import POLICIES, open_bundle
from runtime.host import HostManager
from tests.support.bundles import MODELS, MODES, assert_identical, case, cpus, devices, feeds


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("model", MODELS)
def test_bundle_matches_jit(model, n, mode, policy):
    c = case(model, n, mode)
    assert c.compiled.plan == c.jit_plan  # the same plan, not re-made at load
    requests = feeds(model)
    with open_bundle(c.path, policy) as driver:
        if policy == "pipelined":  # requests in flight at once, from several threads
            with ThreadPoolExecutor(len(requests)) as pool:
                answers = list(pool.map(driver.run, requests))
        else:
            answers = [driver.run(f) for f in requests]
    for got, want in zip(answers, c.jit_outputs, strict=True):
        assert_identical(got, want, f"{model}/{n}/{mode}/{policy}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("model", MODELS)
def test_bundle_in_the_host_matches_jit(model, n, mode):
    """The host loads the bundle's plan as compiled (no partitioning) and answers requests
    in flight at once exactly as the just-in-time path did."""
    c = case(model, n, mode)
    with HostManager(list(devices(model, n, mode))) as host:
        plan = host.add_network(model, c.path)
        assert plan.partitions == c.jit_plan.partitions
        assert plan.transfers == c.jit_plan.transfers
        futures = [host.run(model, f) for f in feeds(model)]
        answers = [f.result(timeout=60) for f in futures]
    for got, want in zip(answers, c.jit_outputs, strict=True):
        assert_identical(got, want, f"{model}/{n}/{mode}/host")


@pytest.mark.parametrize("mode", MODES)
def test_matrix_splits_in_every_mode(mode):
    """The matrix is worth its name: with 2+ devices every model splits in balanced and
    user mode, and in memory mode wherever its devices could be sized to force it."""
    default = cpus(1)[0].memory_bytes
    for model in MODELS:
        for n in (2, 3, 4):
            parts = len(case(model, n, mode).compiled.plan.partitions)
            tight = any(d.memory_bytes < default for d in devices(model, n, mode))
            if mode != "memory" or tight:
                assert parts > 1, f"{model} on {n} devices did not split in {mode} mode"
