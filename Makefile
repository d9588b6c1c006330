# Two commands a learner or CI needs (see README):
#   make lab    create the environment if needed, then open the course in JupyterLab
#   make test   create the environment if needed, then run every test
# Everything else here is plumbing for those two, plus what CI also runs: `make site` (the course website),
# `make test-colab` (the notebooks on Colab's older TensorFlow/Keras/ipywidgets) and `make test-cpu-paths`
# (the tutorials' checked outputs on other CPU code paths); and `make test-gpu`, the check for a GPU machine.

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
# `cpu` installs tensorflow-cpu (on macOS plain tensorflow, which has no CUDA there: pyproject's markers);
# on a machine with an NVIDIA GPU use `make lab TF=gpu`.
TF       ?= cpu
STAMP    := $(VENV)/.installed-$(TF)
LAB_STAMP := $(VENV)/.installed-lab-$(TF)
PORT     ?= 8888
JOBS     ?= 2
PYTEST_ARGS ?=
SITE_OUT ?= _build/site

# Colab's stack (.ci/colab-stack.txt) in an environment of its own.
COLAB_VENV  ?= .venv-colab
COLAB_PY    := $(COLAB_VENV)/bin/python
COLAB_STAMP := $(COLAB_VENV)/.installed
# What test-colab runs: the tutorials under nbval, every lab and solution through the grader, and
# the check that this really is Colab's stack.
COLAB_TESTS ?= notebooks tests/grading/grader/test_grade_solutions.py tests/grading/grader/test_grade_labs.py \
               tests/test_packaging.py::test_this_is_colabs_stack

export TF_CPP_MIN_LOG_LEVEL ?= 2
# oneDNN is on by default only on CPUs with AVX-512 (and newer); without it TensorFlow keeps no CPU
# allocator statistics (get_memory_info raises). Turn it on everywhere, so every CPU behaves alike.
export TF_ENABLE_ONEDNN_OPTS ?= 1
export PYTHONDONTWRITEBYTECODE = 1

.PHONY: lab lab-env lab-settings lab-zh zh test test-colab test-cpu-paths test-gpu gpu-env site env colab-env system-deps labs benchmark grade clean help

help:
	@echo "make lab        open the course in JupyterLab (creates .venv on first use)"
	@echo "make test       run every test: helpers, notebooks, labs, solutions, grader, browser, website"
	@echo "make test-colab the notebooks, labs and solutions on Colab's TensorFlow/Keras/ipywidgets (.venv-colab)"
	@echo "make test-cpu-paths  the tutorials' checked outputs again on other CPU code paths (oneDNN capped, OpenBLAS Haswell, oneDNN off)"
	@echo "make test-gpu   on a machine with an NVIDIA GPU: every notebook with the GPU required, then gpu-report.md"
	@echo "make site       build the course website into $(SITE_OUT)/ from the stored outputs"
	@echo "make labs       regenerate labs/ from solutions/ (and the Chinese edition: make zh)"
	@echo "make zh         rebuild the Chinese edition (notebooks/zh-CN, labs/zh-CN) from the English + translations"
	@echo "make lab LANG=zh_CN   the course in Chinese, with JupyterLab's menus in Chinese"
	@echo "make benchmark  print the tf.data / XLA / capstone ratio table and this machine's roofline"
	@echo "make grade SUBMISSION=path.ipynb   grade one submission (or a folder of them)"

env: $(STAMP)

# Everything `make test` needs: the runtime, JupyterLab, the test tools and the website's. uv (one of the test tools,
# put in first by pip) installs the rest: on a fresh machine it downloads and unpacks in parallel (30 s instead of
# pip's 63 s on a 2-core CI machine, the same versions), and --compile-bytecode writes the .pyc files pip would have
# written (without them every TensorFlow process compiles TensorFlow). uv reads none of pip's settings (pip.conf,
# PIP_INDEX_URL): where it cannot install, pip does. `make lab` installs with pip alone, as a learner expects.
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(PY) -e ".[$(TF),lab,dev,site]" || \
	  $(PY) -m pip install --quiet -e ".[$(TF),lab,dev,site]"
	@$(MAKE) --no-print-directory lab-settings
	@touch $@ $(LAB_STAMP)

# What a learner needs for `make lab`: the course's runtime and JupyterLab (no test or website tools).
lab-env: $(LAB_STAMP)

$(LAB_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[$(TF),lab]"
	@$(MAKE) --no-print-directory lab-settings
	@touch $@

# JupyterLab's menus in Chinese: its language pack, and the locale as the environment's default setting.
lab-zh: lab-env
	$(PY) -m pip install --quiet jupyterlab-language-pack-zh-CN
	@printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}, "@jupyterlab/translation-extension:plugin": {"locale": "zh_CN"}}' > $(LAB_SETTINGS)

# JupyterLab's defaults for this course: no "Jupyter news?" prompt and no update check (both would
# contact a website), written as the environment's settings overrides.
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
lab-settings:
	@mkdir -p $(dir $(LAB_SETTINGS))
	@printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $(LAB_SETTINGS)

# Debian packages the tests need: Chromium for the browser test (no browser is downloaded), a CJK font so that
# the Chinese pages' screenshots show characters, not boxes, and bubblewrap, the grader's sandbox for each
# graded kernel (docs/instructors.md), and SLURM with munge (slurmctld, slurmd, slurm-client, munge), on which
# tests/test_slurm_real.py runs the SLURM template as a one-node cluster. Installs only what is missing and only
# when we may (root); otherwise it says what is missing: the browser and SLURM tests then skip (fail when CI=true),
# the grader runs less isolated and says so.
# Each entry of SYSTEM_DEPS is "package:test", the test a shell command that succeeds when the package is there.
# apt waits up to APT_LOCK_WAIT seconds for another apt (unattended upgrades on a fresh machine) instead of failing.
SYSTEM_DEPS := \
  chromium:'[ -n "$$CHROMIUM" ] || command -v chromium || command -v chromium-browser || command -v google-chrome || command -v google-chrome-stable' \
  fonts-noto-cjk:'dpkg -s fonts-noto-cjk || fc-list | grep -qi "Noto Sans CJK"' \
  bubblewrap:'command -v bwrap' \
  slurmctld:'command -v slurmctld || [ -x /usr/sbin/slurmctld ]' \
  slurmd:'command -v slurmd || [ -x /usr/sbin/slurmd ]' \
  slurm-client:'command -v sbatch || [ -x /usr/sbin/sbatch ]' \
  munge:'command -v munged || [ -x /usr/sbin/munged ]'
APT_LOCK_WAIT ?= 600
APT_GET := apt-get -o DPkg::Lock::Timeout=$(APT_LOCK_WAIT)

system-deps:
	@missing=""; for dep in $(SYSTEM_DEPS); do \
	  sh -c "$${dep#*:}" >/dev/null 2>&1 || missing="$$missing $${dep%%:*}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's$$missing for the tests (waiting up to $(APT_LOCK_WAIT) s for another apt)"; \
	    $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing >/dev/null; \
	  else \
	    echo "note: missing$$missing and cannot apt-get install it (see the Makefile's system-deps)"; \
	  fi; \
	fi

# JupyterLab refuses to start as root (containers, cloud VMs) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)

# The URL JupyterLab prints opens notebook 01 itself (not the Launcher). `make lab LANG=zh_CN` (or a Chinese
# desktop's LANG=zh_CN.UTF-8) opens the Chinese notebook 01 with JupyterLab's own menus in Chinese.
ZH := $(filter zh%,$(LANG))
FIRST_NOTEBOOK := $(if $(ZH),notebooks/zh-CN/01_device_detection.ipynb,notebooks/01_device_detection.ipynb)
lab: lab-env $(if $(ZH),lab-zh,lab-settings)
	$(VENV)/bin/jupyter lab --port=$(PORT) --ServerApp.root_dir=. $(ROOT_FLAG) \
	  --LabApp.default_url=/lab/tree/$(FIRST_NOTEBOOK) $(FIRST_NOTEBOOK)

test: env system-deps
	$(PY) -m pytest -n $(JOBS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# The website: stored outputs only, nothing is executed (site/build.py, site/conf.py).
site: env
	$(PY) site/build.py $(SITE_OUT)

# Colab's runtime: its pinned TensorFlow, Keras, ipywidgets (.ci/colab-stack.txt) in .venv-colab. Then,
# on every run, the notebooks' own setup cell is executed there as on Colab (.ci/colab_setup.py: it
# installs the course from this checkout --no-deps, plus its extra packages, and checks that Colab's
# pins survived and TensorFlow and the profiler still work), and the tests run in that environment.
colab-env: $(COLAB_STAMP)

$(COLAB_STAMP): .ci/colab-stack.txt
	@test -x $(COLAB_PY) || $(PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_PY) -m pip install --quiet --upgrade pip
	$(COLAB_PY) -m pip install --quiet -r .ci/colab-stack.txt
	@touch $@

# (PYDEVD_DISABLE_FILE_VALIDATION: Colab's ipykernel 6.17 warns about frozen modules in every kernel.)
test-colab: colab-env
	$(COLAB_PY) .ci/colab_setup.py
	GPUCOURSE_COLAB_STACK=1 PYDEVD_DISABLE_FILE_VALIDATION=1 $(COLAB_PY) -m pytest -n $(JOBS) --dist loadfile -p no:cacheprovider $(COLAB_TESTS)

# Checked outputs (# NBVAL_CHECK_OUTPUT) must be the same on every CPU: CPUs differ in their kernels (oneDNN,
# OpenBLAS and Eigen pick code by instruction set), so the tutorials run again under nbval with other code paths:
# oneDNN capped at AVX2, then at AVX512_CORE, with OpenBLAS on its Haswell kernels, then oneDNN off. Probes on this
# machine decide which path is new here and which tutorial can run on it (.ci/cpu_paths.py prints what it left
# out, and why). Any difference fails, and so does a tutorial left with no path but the default.
test-cpu-paths: env
	$(PY) .ci/cpu_paths.py --jobs $(JOBS)

# The GPU check (README, "Checking a GPU"): without an NVIDIA GPU it stops at once, before installing anything;
# otherwise .venv-gpu with tensorflow[and-cuda], every tutorial, lab and solution with the GPU required (a
# notebook that falls back to the CPU fails), the GPU-only tests, the measurements, and gpu-report.md.
GPU_VENV  ?= .venv-gpu
GPU_PY    := $(GPU_VENV)/bin/python
GPU_STAMP := $(GPU_VENV)/.installed
GPU_REPORT ?= gpu-report.md

test-gpu:
	@$(PYTHON) -m utils.gpureport preflight
	@$(MAKE) --no-print-directory gpu-env
	$(GPU_PY) -m gpucourse.gpureport run --report $(GPU_REPORT) --jobs $(JOBS)

gpu-env: $(GPU_STAMP)

$(GPU_STAMP): pyproject.toml
	@test -x $(GPU_PY) || $(PYTHON) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade pip
	$(GPU_PY) -m pip install --quiet -e ".[gpu,dev]"
	@touch $@

labs: env
	$(PY) -m gpucourse.labgen
	@$(MAKE) --no-print-directory zh

# The Chinese edition (docs/instructors.md, "Translations"): refresh every PO file from its English notebook
# (new cells empty, changed cells fuzzy), refresh check()'s message catalogue, build the zh notebooks, list
# what still needs a translator.
zh: env
	$(PY) -m gpucourse.i18n update
	$(PY) -m gpucourse.i18n messages
	$(PY) -m gpucourse.i18n build
	@$(PY) -m gpucourse.i18n check || echo "the zh edition needs translating (above); tests/tools/test_i18n.py fails until it is done"

benchmark: env
	$(PY) -m gpucourse.benchmark

grade: env
	$(PY) -m gpucourse.grading.grader.cli $(SUBMISSION)

clean:
	rm -rf $(VENV) $(COLAB_VENV) $(GPU_VENV) .pytest_cache grading-output _build gpu-test-output
