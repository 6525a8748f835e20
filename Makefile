# Installs come from the committed lock (uv.lock, hashes checked), never from a fresh
# resolution: a release elsewhere cannot change what a clone gets. pip installs only uv
# itself, pinned by hash in uv-bootstrap.txt; uv then syncs .venv to the lock.
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
STAMP := $(VENV)/.installed
LATEST := .venv-latest
export UV_PYTHON_DOWNLOADS := never

.PHONY: run test test-latest bench lint lock samples clean chromium

$(STAMP): pyproject.toml uv.lock uv-bootstrap.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --require-hashes -r uv-bootstrap.txt
	$(UV) sync --quiet --frozen --extra dev --python $(PY)
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/prism tui

# the browser tests drive Debian's Chromium; install it when missing (root, or sudo)
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update && $$SUDO apt-get install -y chromium; }

test: $(STAMP) chromium
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m pytest -q

# The suite against the newest releases of every dependency, in a venv of its own: drift
# is found on purpose here, not by a clone one morning. Not part of `make test`.
test-latest: $(STAMP) chromium
	rm -rf $(LATEST)
	$(UV) venv --quiet --python $(PY) $(LATEST)
	$(UV) pip install --quiet --python $(LATEST)/bin/python --upgrade --refresh -e '.[dev]'
	$(UV) pip list --python $(LATEST)/bin/python --format freeze \
	  | grep -iE '^(onnx|onnxruntime|numpy|textual|streamlit|rich|networkx)=='
	$(LATEST)/bin/python -m pytest -q -p no:cacheprovider

# Refresh the lock to the newest releases pyproject.toml allows (and uv itself).
lock: $(STAMP)
	$(UV) lock --upgrade --python $(PY)
	echo uv | $(UV) pip compile - --quiet --upgrade --universal --generate-hashes --no-header \
	  -o uv-bootstrap.txt

bench: $(STAMP)
	$(PY) -m benchmarks.run

lint: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format --check . || true

samples: $(STAMP)
	$(PY) sample_models/make_samples.py

clean:
	rm -rf $(VENV) $(LATEST) .pytest_cache .ruff_cache
