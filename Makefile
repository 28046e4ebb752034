# A thin facade: every target is one `python -m ...` line, so everything also works without make.
#   make install      make test PART=1      make bench PART=1      make diff PART=2      make notebook PART=0
# `make install` makes a virtual environment in .venv (python -m common.install first picks torch's
# CPU build on a machine without a GPU), then pip install -e ".[dev]". Every other target installs
# first if .venv is not there. With torch and Triton already installed, use that Python as it is:
#   make test PYTHON=python3       (JOBS=1 where that Python has no pytest-xdist)

PART ?=
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PART_ARG = $(if $(PART),--part $(PART),)
# The tests in JOBS processes (pytest-xdist; auto: one per CPU core); JOBS=1 for a Python without it.
JOBS ?= auto
JOBS_ARG = $(if $(filter 1,$(JOBS)),,-n $(JOBS))
FOLDER = $(firstword $(wildcard part$(PART)_*))
STEP_ARG = $(if $(STEP),--step $(STEP),)

# Only the default PYTHON needs the virtual environment built.
ifeq ($(PYTHON),$(VENV)/bin/python)
ENV = $(VENV)/.installed
endif

.PHONY: exercise check install test test-house bench report diff profile notebook notebook-part sweep autotune coldstart train-bench targets lint results clean help

help:
	@echo "make install            .venv with torch (its CPU build where there is no GPU) and pip install -e \".[dev]\""
	@echo "make test [PART=N]      the whole suite, or part N's own tests (a process per core; JOBS=1: one)"
	@echo "make test-house         the house's tests alone: READMEs, report, harness, install"
	@echo "make bench [PART=N]     check, then time against every SDPA backend (GPU); check only without a GPU"
	@echo "make report [GPU=h200]  README tables and plots from results/h200/; GPU=x: results/x/summary.md only"
	@echo "make exercise PART=N    part N's exercises; NAME=x hands one out into workspace/ (FORCE=1: again, over your work)"
	@echo "make check PART=N NAME=x  grade your exercise: the tests that see its idea, on a CPU in under a minute"
	@echo "make diff PART=N        what part N changes in part N-1's kernel; STEP=2 (part 3), STEP=fwd3 (part 5): one step"
	@echo "make profile PART=N     part N's kernels: GPU time, compiler resources, hardware counters where ncu can (GPU)"
	@echo "make notebook PART=N    part N's walkthrough.py as a Jupyter notebook (RUN=1: also run it; stops at an error)"
	@echo "make sweep              part 2's tile/warp/stage sweep (GPU)"
	@echo "make autotune           part 2's autotune cost, cold and warm (GPU)"
	@echo "make coldstart [PART=N] first calls of the Triton parts in fresh processes with an empty Triton cache"
	@echo "make targets [QUICK=1]  every Triton part compiled for sm_80 ... sm_120, checked against their shared memory"
	@echo "make train-bench        a small Llama (transformers) with SDPA and part 5: training steps, eager/compiled/CUDA graphs, and decoding (GPU)"
	@echo "make results [GPU=...]  every GPU measurement behind the READMEs, then the report from results/<GPU>/"
	@echo "make lint | clean"

install: $(VENV)/.installed

# Quiet (pip prints only errors; PYTHONWARNINGS hides setuptools' notice about editable installs);
# VERBOSE=1 shows pip's whole log.
PIP_QUIET = $(if $(VERBOSE),,--quiet)
$(VENV)/.installed: pyproject.toml
	@echo "Installing torch, Triton and the tools into $(VENV): on a CPU machine about 2.4 GB, 1-3 minutes"
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m common.install
	PYTHONWARNINGS=ignore $(VENV)/bin/python -m pip install $(PIP_QUIET) -e ".[dev]"
	touch $@
	@echo "Installed. Activate it (. $(VENV)/bin/activate) to run python and pytest; make uses it by itself."

test: $(ENV)
	$(PYTHON) -m pytest $(JOBS_ARG) $(PART_ARG)

test-house: $(ENV)
	$(PYTHON) -m pytest $(JOBS_ARG) --house

bench: $(ENV)
	$(PYTHON) -m lab.bench $(PART_ARG)

report: $(ENV)
	$(PYTHON) -m lab.report $(if $(GPU),--gpu $(GPU),)

profile: $(ENV)
	@test -n "$(PART)" || { echo "usage: make profile PART=N"; exit 2; }
	$(PYTHON) -m part5_profiling.tools.profile --part $(PART)

# Standard library only (like diff): listing and handing out need no torch.
exercise:
	@test -n "$(PART)" || { echo "usage: make exercise PART=N [NAME=x [FORCE=1]]"; exit 2; }
	@python3 -m common.exercises --part $(PART) $(if $(NAME),--name $(NAME),) $(if $(FORCE),--force,)

check: $(ENV)
	@test -n "$(PART)" -a -n "$(NAME)" || { echo "usage: make check PART=N NAME=x"; exit 2; }
	@$(PYTHON) -m common.exercises --part $(PART) --name $(NAME) --check

diff:
	@python3 -m common.diff $(PART_ARG) $(STEP_ARG)

# A notebook with the standard "python3" kernel; RUN=1 executes it, from the repository root (so
# `common` imports), writes the outputs into it and fails at the first cell that raises.
# (ipykernel warns that the local kernel talks to jupytext over TCP without encryption: expected here, so hidden.)
notebook: notebook-part $(ENV)
	bash -o pipefail -c '$(PYTHON) -m jupytext --to ipynb --set-kernel python3 $(if $(RUN),--execute --run-path "$(CURDIR)",) \
		$(FOLDER)/walkthrough.py 2>&1 | grep -v "Kernel is running over TCP without encryption"'
	@echo "Open $(FOLDER)/walkthrough.ipynb in JupyterLab, Jupyter Notebook or VS Code, from this folder (a notebook"
	@echo "server is not installed here: pip install jupyterlab, then jupyter lab). RUN=1 runs it here and saves the outputs."

notebook-part:
	@test -f "$(FOLDER)/walkthrough.py" || { echo "usage: make notebook PART=N, for a part that has a walkthrough.py"; exit 2; }

sweep: $(ENV)
	$(PYTHON) -m part2_tile_tuning.tools.sweep

autotune: $(ENV)
	$(PYTHON) -m lab.coldstart --autotune --part 2

coldstart: $(ENV)
	$(PYTHON) -m lab.coldstart $(PART_ARG)

train-bench: $(ENV)
	$(PYTHON) -m lab.train_step

# No GPU needed: Triton's compiler builds every part's kernels for sm_80 ... sm_120 (QUICK=1: what CI checks)
targets: $(ENV)
	$(PYTHON) -m lab.targets $(if $(QUICK),--quick,)

lint: $(ENV)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .

# Float32: the small tiles against the 16-bit ones (what float32 calls compiled before they had their own)
FP32_FORWARD = 32x64w4s2 64x32w4s2 64x64w8s2 32x32w4s2 128x128w4s3 128x64w4s4 256x64w8s3 128x64w4s2
FP32_DKDV = 32x64w4s2 32x32w4s2 16x32w4s2 64x64w8s2 64x64w4s2 32x128w4s3
FP32_DQ = 32x16w4s1 32x32w4s2 64x32w8s2 128x64w8s3 128x32w4s3 64x64w4s2

# The tests first (make test), then every GPU measurement behind the READMEs, then the report.
results: $(ENV) test
	$(PYTHON) -m part2_tile_tuning.tools.sweep
	$(PYTHON) -m part3_inner_loop.tools.sweep
	$(PYTHON) -m part4_backward.tools.sweep --kernel dkdv
	$(PYTHON) -m part4_backward.tools.sweep --kernel dq
	$(PYTHON) -m lab.bench --mode fwd --mode fwd+bwd --mode bwd --flex
	$(PYTHON) -m lab.coldstart --autotune --part 2
	$(PYTHON) -m lab.coldstart --parallel 8
	$(PYTHON) -m part3_inner_loop.tools.sweep --dtype fp32 --configs $(FP32_FORWARD)
	$(PYTHON) -m part4_backward.tools.sweep --kernel dkdv --dtype fp32 --configs $(FP32_DKDV)
	$(PYTHON) -m part4_backward.tools.sweep --kernel dq --dtype fp32 --configs $(FP32_DQ)
	$(PYTHON) -m part3_inner_loop.tools.ablation
	$(PYTHON) -m part4_backward.tools.dq_atomics
	$(PYTHON) -m part4_backward.tools.memory
	$(PYTHON) -m part5_profiling.tools.ceilings
	$(PYTHON) -m part5_profiling.tools.profile --part 1 --part 2 --part 3 --part 4 --part 5 --sdpa flash --sdpa cudnn
	$(PYTHON) -m part5_profiling.tools.stages
	$(PYTHON) -m part5_profiling.tools.launch_cost
	$(PYTHON) -m part5_profiling.tools.candidates
	$(PYTHON) -m part5_profiling.tools.candidates --backward
	TRITON_INTERPRET=0 $(PYTHON) -m part5_profiling.tools.candidates --compile
	$(PYTHON) -m part5_profiling.tools.ladder
	TRITON_INTERPRET=0 $(PYTHON) -m part5_profiling.tools.ladder --compile --save
	$(PYTHON) -m part5_profiling.tools.gluon_study
	$(PYTHON) -m part5_profiling.tools.gluon_study --backward
	$(PYTHON) -m lab.train_step
	$(PYTHON) -m part5_profiling.tools.step_profile
	$(PYTHON) -m lab.report $(if $(GPU),--gpu $(GPU),)

clean:
	rm -rf .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -name '*.ipynb' -print -exec rm -f {} +
