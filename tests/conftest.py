"""Shared fixtures: sample models and hypothesis profiles, for every folder of tests.

`tests` is a package (each folder has an `__init__.py`), so a test module is imported by
its full dotted name (`tests.host.test_dispatch`), two folders may hold modules of the
same name, and the helpers in `tests/support/` are imported as any package is:
`from tests.support.fakes import FakeDevice`. The repository root, where `tests` lives,
is on `sys.path` through pytest's `pythonpath = ["."]` (pyproject.toml's
`[tool.pytest.ini_options]`), however pytest is started; nothing inserts a path here.

Costs: plans in the suite use the roofline (`PRISM_COSTS=model`) unless a test asks for
measured costs, since timing a model on the machine costs seconds and makes a plan depend
on how busy the machine is; whatever is measured goes to a temporary cache directory
(`PRISM_CACHE_DIR`), never the user's. Subprocesses (the CLI tests) inherit both.

Profiles: `dev` (default) explores new examples on every run; `ci` is derandomized so a
run is repeatable. Pick one with HYPOTHESIS_PROFILE=ci.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tests.support.dags import SAMPLE_NAMES, SAMPLES_DIR

os.environ["PRISM_COSTS"] = "model"
os.environ["PRISM_CACHE_DIR"] = _CACHE = tempfile.mkdtemp(prefix="prism-cache-")
atexit.register(shutil.rmtree, _CACHE, True)

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
