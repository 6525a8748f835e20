VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test bench lint samples clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/prism tui

test: $(STAMP)
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
