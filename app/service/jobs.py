"""What a request asks of a model and what it gets back: the job, the result, the errors a
request can cause, and the rule for the language a job runs in (shared by REST and every live
protocol)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from app.engine.languages import LANGUAGES
from app.service.transcriber import Segment, TranscriptionInfo

Task = Literal["transcribe", "translate"]
_LANGUAGE_BY_NAME = {name: code for code, name in LANGUAGES.items()}


class UnknownModelError(LookupError):
    """A request named a model that is not loaded (`detail` replaces the standard message)."""

    def __init__(self, name: str, loaded: Sequence[str], detail: str | None = None) -> None:
        super().__init__(
            detail
            or f"The model '{name}' does not exist or is not loaded on this server; "
            f"loaded models: {', '.join(loaded)}"
        )
        self.name = name


class ModelUnavailableError(UnknownModelError):
    """A request named a model that cannot serve now for a passing reason: it is loading, being
    unloaded, or every slot is taken; `code` says which, `retry_after_s` when to try again."""

    def __init__(self, name: str, message: str, code: str, retry_after_s: int = 5) -> None:
        super().__init__(name, (), message)
        self.code = code
        self.retry_after_s = retry_after_s


class InvalidRequestError(ValueError):
    """A request parameter has a value the service cannot use; `param` names it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ModelInfo:
    """What /health and /v1/models report about a loaded model."""

    name: str
    multilingual: bool
    devices: dict[str, str]  # {"encoder": "CPU", "decoder": "CPU"}
    load_s: float
    warmup_s: float
    created: int  # unix time the folder was built (manifest mtime)
    memory_bytes: int | None = None  # RSS growth across load + warm-up (see model_open)


@dataclass(frozen=True)
class TranscriptionJob:
    """One request's work: the raw upload and what the client asked for."""

    audio: bytes  # the uploaded file, any supported container
    task: Task = "transcribe"
    language: str | None = None  # ISO-639-1 code or English name; None = detect
    prompt: str | None = None
    temperature: float | None = None  # None or 0 = fallback schedule; > 0 = that temperature only
    beam_size: int | None = None  # None = the transcriber's default
    # hallucination defences; None = the server's default (its base options)
    vad_filter: bool | None = None
    no_speech_threshold: float | None = None
    repetition_guard: bool | None = None
    word_timestamps: bool = False  # words (and token log-probs) on each segment
    hotwords: str | None = None  # terms that bias every window's prompt
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


def language_code(language: str | None) -> str | None:
    """Normalise "en" / "EN" / "english" to "en"; None stays None; unknown raises."""
    if language is None or not language.strip():
        return None
    key = language.strip().lower()
    if key in LANGUAGES:
        return key
    if key in _LANGUAGE_BY_NAME:
        return _LANGUAGE_BY_NAME[key]
    raise InvalidRequestError(
        f"Unsupported language '{language}': use an ISO-639-1 code such as 'en' or 'de'",
        param="language",
    )


def model_languages(multilingual: bool) -> list[str]:
    """The language codes a model takes: every Whisper language, or English only."""
    return list(LANGUAGES) if multilingual else ["en"]


def model_language(name: str, multilingual: bool, language: str | None) -> str | None:
    """The language a job or stream on model `name` runs in: `language` normalised (None =
    detect); always "en" on an English-only model, which takes no other (InvalidRequestError).
    """
    code = language_code(language)
    if multilingual:
        return code
    if code not in (None, "en"):
        raise InvalidRequestError(
            f"The model '{name}' is English-only; it cannot transcribe language '{code}'",
            param="language",
        )
    return "en"
