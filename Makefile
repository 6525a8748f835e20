VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint samples clean chromium

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
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
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m benchmarks.run

lint: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format --check . || true

samples: $(STAMP)
	$(PY) sample_models/make_samples.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
