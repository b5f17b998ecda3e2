"""What a request asks of a model and what it gets back: the job (audio, options, limits), the
result, and the refusals that name a model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.service.errors import Rejected
from app.service.transcription.options import Task, TranscriptionOptions
from app.service.transcription.transcriber import Segment, TranscriptionInfo


class UnknownModelError(Rejected):
    """A request named a model that is not loaded (`detail` replaces the standard message)."""

    def __init__(self, name: str, loaded: Sequence[str], detail: str | None = None) -> None:
        super().__init__(
            "model_not_found",
            detail
            or f"The model '{name}' does not exist or is not loaded on this server; "
            f"loaded models: {', '.join(loaded)}",
            param="model",
            kind="not_found",
        )
        self.name = name


class ModelUnavailableError(UnknownModelError):
    """A request named a model that cannot serve now for a passing reason: it is loading, being
    unloaded (a conflict), or every slot is taken; `code` says which, `retry_after_s` when to try
    again."""

    def __init__(self, name: str, message: str, code: str, retry_after_s: int = 5) -> None:
        super().__init__(name, (), message)
        self.code = code
        self.kind = "conflict" if code == "model_unloading" else "unavailable"
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class ModelInfo:
    """What /health and /v1/models report about a loaded model."""

    name: str
    multilingual: bool
    devices: dict[str, str]  # {"encoder": "CPU", "decoder": "CPU"}
    arithmetic: dict[str, str]  # per stage: precision, how int8-input layers multiply
    load_s: float
    warmup_s: float
    created: int  # unix time the folder was built (manifest mtime)
    memory_bytes: int | None = None  # RSS growth across load + warm-up (see models.opening)


@dataclass(frozen=True)
class TranscriptionJob:
    """One request's work: the audio, the options it is transcribed with (built at the edge that
    took the request) and its limit. `task` is what the client asked for (reported back): an
    English-only model's options transcribe where the client asked to translate."""

    audio: bytes  # the uploaded file, any supported container (b"" for decoded samples)
    options: TranscriptionOptions
    task: Task = "transcribe"
    max_audio_s: float | None = None  # longer uploads raise AudioTooLongError


@dataclass(frozen=True)
class TranscriptionResult:
    """All segments of one transcription plus timings (seconds)."""

    segments: list[Segment]
    info: TranscriptionInfo
    text: str
    language: str  # ISO-639-1 code
    language_name: str  # Whisper's English name ("english"), as OpenAI's verbose_json reports
    duration_s: float  # audio length
    task: Task
    # seconds per stage: decode_audio, mel, encoder, language, decoder, search, transcribe (all)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def rtf(self) -> float:
        """Real-time factor of the transcription stage (processing time / audio time)."""
        return self.timings.get("transcribe", 0.0) / self.duration_s if self.duration_s else 0.0
