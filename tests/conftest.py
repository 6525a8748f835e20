"""Shared fixtures: sample models and hypothesis profiles.

Profiles: `dev` (default) explores new examples on every run; `ci` is derandomized so a
run is repeatable. Pick one with HYPOTHESIS_PROFILE=ci.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dags import SAMPLE_NAMES, SAMPLES_DIR, sample_graph

__all__ = ["sample_graph"]  # also importable from here: `from conftest import sample_graph`

_COMMON = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow,
                                                        HealthCheck.data_too_large]}
settings.register_profile("dev", **_COMMON)
settings.register_profile("ci", derandomize=True, print_blob=True, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(params=SAMPLE_NAMES)
def sample_name(request) -> str:
    return request.param


@pytest.fixture
def samples_dir() -> Path:
    return SAMPLES_DIR
