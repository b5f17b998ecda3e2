# Speech-to-text service: Whisper as ONNX on OpenVINO (CPU, Intel GPU, Intel NPU).
#
#   docker build -t stt-openvino .                                  # bakes in `base`
#   docker build --build-arg MODELS="tiny.en base" -t stt-openvino .
#   docker build --build-arg MODELS="large-v3-turbo" -t stt-openvino .    # from the Hugging Face Hub
#   docker run -p 8000:8000 stt-openvino
#
# The build stage builds the models with the command `make models` runs, so a model folder made
# here is the same as one made on a developer's machine. See docs/DOCKER.md.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ------------------------------------------------------------------------------------ build
FROM ${PYTHON_IMAGE} AS build
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
# make: the models are built by the Makefile's own `make models` recipe (one recipe, two callers).
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends make \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

# Runtime dependencies first (the list in pyproject.toml), so editing app/ keeps this layer.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" > /tmp/requirements.txt \
 && pip install --no-cache-dir -r /tmp/requirements.txt

COPY app/ app/
RUN pip install --no-cache-dir --no-deps . \
 && touch /opt/venv/.runtime

# Model ids, separated by spaces or commas: catalog names and aliases (`python -m app.export list`:
# tiny.en, base, small, medium, large-v3, large-v3-turbo, distil-large-v3, ...) or Hugging Face
# repository ids (org/name, e.g. Systran/faster-whisper-small). Hub weights are downloaded here
# (HF_ENDPOINT is honoured) and only the built folders reach the image; gated repositories are
# better fetched at run time with HF_TOKEN set (STT_MODEL_DOWNLOADS=1), so no token is baked in.
# PRECISION (int8 | fp16 | fp32) is passed to the export, empty = its default.
# `-o` and the stamp: the venv is set up above, make only runs the models recipe.
COPY Makefile ./
ARG MODELS=base
ARG PRECISION=
ARG HF_ENDPOINT=https://huggingface.co
ENV HF_ENDPOINT=${HF_ENDPOINT} \
    HF_HUB_DISABLE_TELEMETRY=1
RUN for m in $(echo "$MODELS" | tr "," " "); do \
        make -o /opt/venv/.runtime models VENV=/opt/venv MODELS_DIR=/models MODEL="$m" \
            PRECISION="$PRECISION"; \
    done \
 && ls -l /models

# ---------------------------------------------------------------------------------- runtime
FROM ${PYTHON_IMAGE} AS runtime
ARG MODELS=base
# INTEL_GPU=1 adds Intel's OpenCL runtime (Debian's intel-opencl-icd) for STT_DEVICE=GPU.
ARG INTEL_GPU=0
LABEL org.opencontainers.image.title="stt-openvino" \
      org.opencontainers.image.description="Whisper speech-to-text, ONNX on OpenVINO, OpenAI-compatible API"

# hadolint ignore=DL3008
RUN if [ "$INTEL_GPU" = "1" ]; then \
        apt-get update \
     && apt-get install -y --no-install-recommends intel-opencl-icd \
     && rm -rf /var/lib/apt/lists/*; \
    fi

RUN groupadd --system --gid 10001 stt \
 && useradd --system --no-log-init --uid 10001 --gid stt --home-dir /home/stt --create-home \
        --shell /usr/sbin/nologin stt \
 && mkdir -p /cache/openvino /cache/huggingface /data \
 && chown stt:stt /cache/openvino /cache/huggingface /data

COPY --from=build /opt/venv /opt/venv
# Owned by the service's user: with STT_MODEL_DOWNLOADS it builds new models there at run time.
COPY --from=build --chown=10001:10001 /models /models
COPY docker/entrypoint.sh /usr/local/bin/stt-entrypoint

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    STT_MODELS=${MODELS} \
    STT_MODELS_DIR=/models \
    STT_HOST=0.0.0.0 \
    STT_PORT=8000 \
    STT_OV_CACHE_DIR=/cache/openvino \
    STT_DATA_DIR=/data \
    HF_HOME=/cache/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1 \
    MALLOC_ARENA_MAX=2 \
    MALLOC_MMAP_THRESHOLD_=8388608 \
    MALLOC_TRIM_THRESHOLD_=33554432

USER 10001:10001
WORKDIR /home/stt
EXPOSE 8000 10300

# /health answers 503 until the models are loaded and warmed up; urlopen raises on any non-2xx.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; u.build_opener(u.ProxyHandler({})).open('http://127.0.0.1:%s/health' % os.environ.get('STT_PORT', '8000'), timeout=4)"]

ENTRYPOINT ["stt-entrypoint"]
# One worker per container: concurrency comes from the service's own worker pool (STT_WORKERS).
CMD ["uvicorn", "--factory", "app.main:create_app", "--workers", "1"]
