# A thin facade: every target is one `python -m ...` line, so everything also works without make.
#   make test PART=1      make bench PART=1      make diff PART=2      make notebook PART=0
# By default a virtual environment is made in .venv on first use (from requirements.txt).
# With torch and Triton already installed, use that Python as it is:  make test PYTHON=python3

PART ?=
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PART_ARG = $(if $(PART),--part $(PART),)
FOLDER = $(firstword $(wildcard part$(PART)_*))

# Only the default PYTHON needs the virtual environment built.
ifeq ($(PYTHON),$(VENV)/bin/python)
ENV = $(VENV)/.installed
endif

.PHONY: test bench report diff notebook notebook-part sweep autotune lint results clean help

help:
	@echo "make test [PART=N]      correctness suite (all parts, or part N)"
	@echo "make bench [PART=N]     check, then time against every SDPA backend (GPU); check only without a GPU"
	@echo "make report             plots and README tables from results/<gpu>/*.csv"
	@echo "make diff PART=N        what part N changes in part N-1's kernel"
	@echo "make notebook PART=N    part N's walkthrough.py as a Jupyter notebook"
	@echo "make sweep              part 2's tile/warp/stage sweep (GPU)"
	@echo "make autotune           part 2's autotune cost, cold and warm (GPU)"
	@echo "make results            every GPU measurement behind the READMEs, then the report"
	@echo "make lint | clean"

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --upgrade pip
	$(VENV)/bin/python -m pip install -r requirements.txt
	touch $@

test: $(ENV)
	$(PYTHON) -m pytest $(PART_ARG)

bench: $(ENV)
	$(PYTHON) -m common.bench $(PART_ARG)

report: $(ENV)
	$(PYTHON) -m common.report

diff:
	@python3 -m common.diff $(PART_ARG)

notebook: notebook-part $(ENV)
	$(PYTHON) -m jupytext --to ipynb $(FOLDER)/walkthrough.py

notebook-part:
	@test -f "$(FOLDER)/walkthrough.py" || { echo "usage: make notebook PART=N, for a part that has a walkthrough.py"; exit 2; }

sweep: $(ENV)
	$(PYTHON) -m part2_tile_tuning.sweep

autotune: $(ENV)
	$(PYTHON) -m part2_tile_tuning.autotune_cost

lint: $(ENV)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

results: $(ENV)
	$(PYTHON) -m pytest
	$(PYTHON) -m part2_tile_tuning.sweep
	$(PYTHON) -m common.bench
	$(PYTHON) -m part2_tile_tuning.autotune_cost
	$(PYTHON) -m common.report

clean:
	rm -rf .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.ipynb' -print -exec rm -f {} +
