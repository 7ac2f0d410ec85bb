# The two commands a newcomer runs: `make demo` and `make test`. Both create .venv when needed.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo test test-slow lint clean chromium

venv: $(STAMP)

$(STAMP): requirements/cpu.txt requirements/torchrec.txt pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (Python 3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements/cpu.txt
	$(PY) -m pip install -q --no-deps -r requirements/torchrec.txt
	$(PY) -m pip install -q --no-deps -e .
	$(PY) -c "import torch, torchrec, fbgemm_gpu; assert torch.version.cuda is None or torch.cuda.is_available(), 'a CUDA torch on a machine without GPU'"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m opengem.demo

# Debian's chromium for the report's headless-browser test; installs only where apt-get runs as root,
# otherwise does nothing (that test then skips, saying why), so `make test` works everywhere.
chromium:
	@if command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing Debian's chromium (report browser test)"; \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium) \
	    >/tmp/opengem-chromium-install.log 2>&1 \
	  || echo "chromium install failed (/tmp/opengem-chromium-install.log): its test will skip"; \
	else echo "no chromium and no root apt-get: the report browser test will skip"; fi

test: $(STAMP) chromium
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
