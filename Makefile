VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch is pinned to the CPU build that lies on disk: an unpinned torch pulls a multi-GB CUDA build.
TORCH ?= torch==2.13.0
FLASHINFER ?= flashinfer-python==0.7.2.post1
VLLM ?= vllm==0.33.0
SGLANG ?= sglang==0.5.23
ENGINE_VENV ?= .venv-engine

# SGLang's MoE layer imports in this venv (with the tests' stand-ins for triton and friends)
export SGLANG_CHECK := from tests.sglang_stubs import installed; \
	exec("with installed(): import sglang.srt.layers.moe.fused_moe_triton.layer")

# One server's install alone (CI's matrix over servers): SERVER=vllm or SERVER=sglang, in
# $(SERVER_VENV), which holds fi-convert with its dev extra, FlashInfer and that server only,
# as `pip install ".[SERVER]"` would but with the server's wheel --no-deps beside the CPU torch
# (as `make install`): of $(VENV)'s distributions, those that installing SERVER_FOLLOW and the
# server's requirements file (dependencies followed) and FlashInfer and the server's wheels
# (--no-deps) installs, linked in (scripts/venv_links.py: seconds, no disk; the two
# requirements files resolve to the same versions alone as together).
# `make test-server` runs there SERVER_TESTS with `--server $(SERVER)`
# (the other server's modules not collected, its marked tests deselected): the plugin's tests
# and the core's that prove the install; the families' model classes run in `make test` (the
# same code, whatever else the venv holds).
SERVER ?= vllm
SERVER_VENV ?= .venv-$(SERVER)
SERVER_TESTS ?= tests/test_$(SERVER)_plugin.py $(SERVER_MORE_TESTS_$(SERVER)) \
	tests/test_layers.py tests/test_hub_fetch.py tests/test_server_option.py tests/test_install.py
SERVER_MORE_TESTS_sglang := tests/test_sglang_models.py tests/test_sglang_ep.py
SERVER_MORE_TESTS_vllm :=
# CI_SUBSET=1 (CI's matrix): the core's install tests whole, and of the plugin's, those that show
# it registers, loads and refuses with the other server absent: the plugin's modules run whole in
# `make test` (both servers installed) and in every release's leg, the other server absent too
SERVER_CORE := test_layers or test_hub_fetch or test_server_option or test_install
SERVER_SMOKE_vllm := entry_point or loader_puts or core_never or loads_no_converter \
	or stock_vllm_refuses_an_output_loudly or repo_id_loads
SERVER_SMOKE_sglang := register_adds or entry_point or facts_and_the_checks or whole_model \
	or stock_sglang or launch_line_parses or repo_id_loads
SERVER_REQUIREMENTS_vllm := requirements/vllm-cpu-test.txt
SERVER_REQUIREMENTS_sglang := requirements/sglang-alone-cpu-test.txt
SERVER_WHEELS_vllm := $(VLLM) xgrammar==0.2.8
SERVER_WHEELS_sglang := $(SGLANG)
SERVER_FOLLOW := $(TORCH) 'fi-convert[dev]' -r requirements/flashinfer-cpu.txt
SERVER_CHECK_vllm := import vllm.model_executor.layers.fused_moe
SERVER_CHECK_sglang := $(SGLANG_CHECK)
OTHER_SERVER_vllm := sglang
OTHER_SERVER_sglang := vllm
export SERVER_CHECK = $(SERVER_CHECK_$(SERVER))

.PHONY: install test fuzz test-engine test-gpu lint demo bench wheel docs clean install-server \
	test-server print-releases install-release test-release install-releases test-releases

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile requirements/vllm-cpu-test.txt requirements/flashinfer-cpu.txt \
		requirements/sglang-cpu-test.txt
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	# the engine venv (scripts/engine_env.sh) may build this project at the same time (CI)
# (setuptools' note that an editable install's folders may shadow the package is silenced: this
# folder is the package's home)
	flock .editable-install.lock env PYTHONWARNINGS='ignore:Editable installation' \
		$(PIP) install -q -e '.[dev,docs]'
# FlashInfer is the test oracle only: its layout functions are plain PyTorch. vLLM 0.33 is
# the test authority (tests/test_vllm.py) and the plugin's host: its Python code beside the
# CPU torch. Both go in without their CUDA-only dependencies
# (see docs/development.md, "Install and test"): first the pure-Python packages they import,
# then the two with --no-deps, last, because every pip install that resolves dependencies
# checks the installed packages' requirements and would print the CUDA-only ones as missing,
# in red, although nothing failed.
# SGLang 0.5.23 is the second authority (tests/test_sglang.py), the same way: its few extra
# pure-Python packages, then its wheel with --no-deps (227 MB in all); triton, IPython
# and torchvision get stand-ins in its tests (tests/sglang_stubs.py).
	$(PIP) install -q -r requirements/flashinfer-cpu.txt
	$(PIP) install -q -c requirements/torch-cpu.txt -r requirements/vllm-cpu-test.txt \
		-r requirements/sglang-cpu-test.txt
	$(PIP) install -q --no-deps $(FLASHINFER) $(VLLM) $(SGLANG) xgrammar==0.2.8
	$(PY) -c "import vllm.model_executor.layers.fused_moe" >/dev/null 2>&1 || \
		$(PY) -c "import vllm.model_executor.layers.fused_moe"
	$(PY) -c "$$SGLANG_CHECK" >/dev/null 2>&1 || $(PY) -c "$$SGLANG_CHECK"
	@echo "installed: $(VENV), with $(FLASHINFER), $(VLLM) and $(SGLANG) as test oracles, beside" \
		"the CPU torch and without their CUDA-only dependencies (pip check reports those as unmet:" \
		"expected)"
	touch $@

test: install
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

install-server: $(SERVER_VENV)/.installed

$(SERVER_VENV)/.installed: $(VENV)/.installed scripts/venv_links.py requirements/torch-cpu.txt \
		requirements/flashinfer-cpu.txt \
		requirements/vllm-cpu-test.txt requirements/sglang-cpu-test.txt \
		requirements/sglang-alone-cpu-test.txt
	@test -n "$(OTHER_SERVER_$(SERVER))" || { echo "SERVER=$(SERVER): vllm or sglang"; exit 2; }
	rm -rf $(SERVER_VENV)
	$(PY) scripts/venv_links.py over $(VENV) $(SERVER_VENV) --follow $(SERVER_FOLLOW) \
		-r $(SERVER_REQUIREMENTS_$(SERVER)) --as-is $(FLASHINFER) $(SERVER_WHEELS_$(SERVER))
	echo '*' >$(SERVER_VENV)/.gitignore
	$(SERVER_VENV)/bin/python -c "$$SERVER_CHECK" >/dev/null 2>&1 || \
		$(SERVER_VENV)/bin/python -c "$$SERVER_CHECK"
	@! $(SERVER_VENV)/bin/python -c "import $(OTHER_SERVER_$(SERVER))" 2>/dev/null || \
		{ echo "$(SERVER_VENV) holds $(OTHER_SERVER_$(SERVER)), which SERVER=$(SERVER) must not"; exit 1; }
	@echo "installed: $(SERVER_VENV), with $(FLASHINFER) and $(SERVER_WHEELS_$(SERVER)) alone" \
		"($(OTHER_SERVER_$(SERVER)) is not installed; linked from $(VENV))"
	touch $@

test-server: install-server
	$(SERVER_VENV)/bin/pytest -q -p no:cacheprovider --server $(SERVER) $(SERVER_TESTS) \
		$(if $(CI_SUBSET),-k "$(SERVER_CORE) or $(SERVER_SMOKE_$(SERVER))")

# Each server release other than make install's (vLLM 0.33.0, SGLang 0.5.23) as a test authority
# (docs/development.md, "vLLM releases", "SGLang releases"): a venv of its own packages over the
# clone's one-server venv ($(SERVER_VENV), `make install-server`), under .venv-releases/
# (scripts/release_env.sh: the release's wheel and the pins of it that the one-server venv does
# not hold installed, every other package of that venv linked in), the clone on PYTHONPATH.
RELEASES_vllm ?= 0.30.0 0.31.0 0.32.0 0.34.0
RELEASES_sglang ?= 0.5.20 0.5.21 0.5.22
RELEASE ?= $(lastword $(RELEASES_$(SERVER)))
# vLLM: the release's own FusedMoE processing against every layout, the plugin on it, EP, the
# releases table's tests, and the release's entry of architectures.json (its own registry).
# CI_SUBSET=1 (CI's legs): the layer cases at TP (and EP) 1 and 2 only, every rank; TP 4 runs in
# `make test` (0.33) and in a plain `make test-release`.
CI_SUBSET ?=
RELEASE_SUBSET_vllm := -k "not -4-"
RELEASE_TESTS_vllm ?= tests/test_vllm.py tests/test_vllm_scales.py tests/test_vllm_mxfp4.py \
	tests/test_vllm_plugin.py tests/test_vllm_ep.py tests/test_vllm_releases.py \
	tests/test_releases_architectures.py
# SGLang: its own MoE processing against every --server sglang layout (each release left out of a
# layout's list is refuted by the same test), the releases table's tests and the release's entry
# of architectures.json; then the plugin's tests (its load, whole models, EP, registration,
# refusals, the families' models, weight updates) of every layout whose bytes the release holds
# (fi_convert/servers/sglang/releases.py's PLUGIN: all but NVFP4 TRT-LLM, whose bytes differ
# before 0.5.23, and ModelOpt FP8 TRT-LLM, which runs Triton before 0.5.23), and non-gated experts and the load-time proof whole (their
# tests show a release left out refuted); the proof's run in a process of its own (13 s, the
# same plumbing on every release) runs in `make test` and a plain run of the module.
RELEASE_TESTS_sglang ?= tests/test_sglang.py tests/test_releases_sglang.py \
	tests/test_releases_architectures.py
RELEASE_SUBSET_sglang := -k "own_bytes or control or releases"
SGLANG_PLUGIN_TESTS ?= tests/test_sglang_plugin.py tests/test_sglang_models.py tests/test_sglang_ep.py \
	tests/test_sglang_non_gated.py tests/test_sglang_families.py tests/test_sglang_family_forms.py \
	tests/test_sglang_release_proof.py tests/test_sglang_updates.py
# HY v4's and Beam's cases show 0.5.23's own models (older releases' HYV4 takes DeepSeek sparse
# attention alone; their Beam does not build on CPU): 0.5.23 only. CI_SUBSET=1 (CI's legs)
# leaves the families' modules to `make test` (0.5.23) and a full leg, for CI's 20 minutes.
# Kimi Linear's case was run on 0.5.23 alone (no older release's venv was built for it), and
# tests/test_sglang_only_families.py (SDAR MoE, LLaDA 2, Xllm, IQuest Q1) is left to `make test`.
SGLANG_PLUGIN_K := (not (nvfp4 and trtllm) and not (fp8-tensor and trtllm) or non_gated \
	or release_proof) and not process_of_its_own and not hy-v4 and not beam_model \
	and not kimi-linear
SGLANG_FAMILY_TESTS := tests/test_sglang_families.py tests/test_sglang_family_forms.py
SGLANG_PLUGIN_K_0.5.20 := $(SGLANG_PLUGIN_K)
SGLANG_PLUGIN_K_0.5.21 := $(SGLANG_PLUGIN_K)
SGLANG_PLUGIN_K_0.5.22 := $(SGLANG_PLUGIN_K)
RELEASE_PYTEST = PYTHONPATH=$(CURDIR) $$venv/bin/python -m pytest -q -p no:cacheprovider \
	--server $(SERVER) --release $(RELEASE)

print-releases:
	@echo $(RELEASES_$(SERVER))

install-release: install-server
	bash scripts/release_env.sh $(SERVER) $(RELEASE) >/dev/null

test-release: install-server
	venv=$$(bash scripts/release_env.sh $(SERVER) $(RELEASE)) && \
	$(RELEASE_PYTEST) $(if $(filter sglang,$(SERVER)),$(RELEASE_SUBSET_sglang),\
		$(if $(CI_SUBSET),$(RELEASE_SUBSET_vllm))) $(RELEASE_TESTS_$(SERVER)) \
	$(if $(filter sglang,$(SERVER)),$(if $(SGLANG_PLUGIN_K_$(RELEASE)),\
	&& $(RELEASE_PYTEST) $(if $(CI_SUBSET),$(filter-out $(SGLANG_FAMILY_TESTS),$(SGLANG_PLUGIN_TESTS)),\
		$(SGLANG_PLUGIN_TESTS)) -k "$(SGLANG_PLUGIN_K_$(RELEASE))"))

install-releases: install-server
	for r in $(RELEASES_$(SERVER)); do bash scripts/release_env.sh $(SERVER) $$r >/dev/null || exit 1; done

test-releases:
	for r in $(RELEASES_$(SERVER)); do $(MAKE) test-release SERVER=$(SERVER) RELEASE=$$r || exit 1; done

# The header fuzz at full size (about a minute on 2 cores): thousands of random corruptions of a
# shard's header at the reader, a few hundred through the CLI; `make test` runs a few hundred.
# FUZZ_SEED picks other cases.
FUZZ_CASES ?= 5000
FUZZ_SEED ?= 0
fuzz: install
	FI_CONVERT_FUZZ=$(FUZZ_CASES) FI_CONVERT_FUZZ_SEED=$(FUZZ_SEED) $(VENV)/bin/pytest -q tests/test_fuzz_headers.py

# A running vllm-cpu 0.32.0 engine (tests/engine/, about 8 minutes on 2 cores): the plugin
# registers in every process, refuses what it must, and loads each rank. engine_env.sh builds
# $(ENGINE_VENV) from scratch when it is missing or stale; ENGINE_ENV_ARGS=--fresh forces it.
test-engine:
	ENGINE_VENV=$(ENGINE_VENV) bash scripts/engine_env.sh $(ENGINE_ENV_ARGS)
	FI_CONVERT_ENGINE_TESTS=1 $(ENGINE_VENV)/bin/pytest -q -p no:cacheprovider --basetemp=$(CURDIR)/.pytest-engine tests/engine

test-gpu: install
	$(VENV)/bin/pytest -q -m gpu

lint: install
	$(VENV)/bin/ruff check fi_convert tests scripts
	$(VENV)/bin/ruff format --check fi_convert tests scripts
	$(VENV)/bin/mypy fi_convert

demo: install
	rm -rf demo
	$(PY) scripts/make_checkpoint.py deepseek-v3 demo/DeepSeek-V3-tiny experts=8
	$(VENV)/bin/fi-convert inspect demo/DeepSeek-V3-tiny --tp-size 2
	$(VENV)/bin/fi-convert demo/DeepSeek-V3-tiny demo/DeepSeek-V3-tiny-fi --tp-size 2
	$(VENV)/bin/fi-convert verify demo/DeepSeek-V3-tiny-fi
	$(PY) scripts/make_checkpoint.py qwen3-moe demo/Qwen3-MoE-tiny hidden=320 intermediate=192
	$(VENV)/bin/fi-convert demo/Qwen3-MoE-tiny demo/Qwen3-MoE-tiny-mxfp8 --scheme mxfp8
	$(PY) -c "from fi_convert import load_moe_layer; t = load_moe_layer('demo/Qwen3-MoE-tiny-mxfp8', 'model.layers.0.mlp.experts'); print({k: (tuple(v.shape), str(v.dtype)) for k, v in t.items()})"

bench: install
	$(PY) scripts/bench.py --out bench-out
	$(PY) scripts/bench_vllm_load.py --out bench-out
	$(PY) scripts/bench_sglang_load.py --out bench-out
	$(PY) scripts/bench_hub.py --out bench-out
	$(PY) scripts/bench_cli_sync.py --out bench-out

# fi-convert is not on PyPI: a server image installs this wheel
# (pip install "dist/fi_convert-<version>-py3-none-any.whl[vllm]"). Built with the venv's
# setuptools, so nothing is downloaded; tests/test_install.py builds and installs it the same way.
wheel: install
	$(PIP) wheel -q --no-deps --no-build-isolation -w dist .
	@ls dist/fi_convert-*.whl

# The docs site (mkdocs.yml, docs/): a broken link or anchor fails the build.
docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(ENGINE_VENV) .venv-vllm .venv-sglang .venv-releases demo .pytest_cache .mypy_cache .ruff_cache dist build site
