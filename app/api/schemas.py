"""Request/response shapes, matching OpenAI's Audio API field for field."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, Field

from app.service.diarize.attribution import SpeakerSegment
from app.service.diarize.job import DiarizedResult
from app.service.models.loaded import TranscriptionResult
from app.service.models.options import ModelStatus
from app.service.models.policy import ModelState
from app.service.transcription.results import Word

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json", "diarized_json"]
TimestampGranularity = Literal["segment", "word"]
Include = Literal["logprobs"]
SpeakerAt = Callable[[float, float], str]  # (start, end) seconds -> the speaker's label


class UsageJSON(BaseModel):
    """Billing-style usage as OpenAI reports it for audio models: whole seconds of audio."""

    type: Literal["duration"] = "duration"
    seconds: int

    @classmethod
    def of(cls, result: TranscriptionResult) -> UsageJSON:
        return cls(seconds=math.ceil(round(result.duration_s, 3)))


class LogprobJSON(BaseModel):
    """One token of `include[]=logprobs`: its text, log-prob and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int]

    @classmethod
    def of_words(
        cls, words: Iterable[Word], token_bytes: Callable[[int], bytes]
    ) -> list[LogprobJSON]:
        """Every token of `words` (aligned words: each token with its log-prob)."""
        return [
            cls(token=raw.decode("utf-8", errors="replace"), logprob=p, bytes=list(raw))
            for w in words
            for t, p in zip(w.tokens, w.logprobs, strict=True)
            for raw in [token_bytes(t)]
        ]


class LanguageJSON(BaseModel):
    """A language the audio was read in (OpenAI's `languages` output): its ISO-639-1 code."""

    code: str

    @classmethod
    def listed(cls, code: str | None) -> list[LanguageJSON]:
        """OpenAI's list: the one language Whisper read the audio in; empty when unknown."""
        return [cls(code=code)] if code else []


class TranscriptionJSON(BaseModel):
    """`response_format=json`; `languages`: the language the text was read in (detected or
    the one asked for)."""

    text: str
    logprobs: list[LogprobJSON] | None = None
    usage: UsageJSON | None = None
    languages: list[LanguageJSON] | None = None

    @classmethod
    def from_result(
        cls, result: TranscriptionResult, token_bytes: Callable[[int], bytes] | None = None
    ) -> TranscriptionJSON:
        """token_bytes: set for `include[]=logprobs` (the words must have been aligned)."""
        logprobs = None
        if token_bytes is not None:
            words = (w for s in result.segments for w in s.words or ())
            logprobs = LogprobJSON.of_words(words, token_bytes)
        return cls(text=result.text, logprobs=logprobs, usage=UsageJSON.of(result),
                   languages=LanguageJSON.listed(result.language))  # fmt: skip


class WordJSON(BaseModel):
    """One word of `timestamp_granularities[]=word`; `probability` is an extension, so is
    `speaker` (with `diarize=true`)."""

    word: str
    start: float
    end: float
    probability: float
    speaker: str | None = None

    @classmethod
    def of(cls, word: Word, speaker_at: SpeakerAt | None = None) -> WordJSON:
        return cls(word=word.word.strip(), start=word.start, end=word.end,
                   probability=word.probability,
                   speaker=speaker_at(word.start, word.end) if speaker_at else None)  # fmt: skip


class TranscriptionSegmentJSON(BaseModel):
    id: int
    seek: int  # offset of the 30 s window, in mel frames (10 ms)
    start: float  # seconds
    end: float  # seconds
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: list[WordJSON] | None = None  # extension: this segment's words
    speaker: str | None = None  # extension (diarize=true): who says most of it


class TranscriptionVerboseJSON(BaseModel):
    """`response_format=verbose_json`."""

    task: Literal["transcribe", "translate"]
    language: str  # English name, e.g. "english", as OpenAI reports it
    duration: float  # seconds of audio
    text: str
    segments: list[TranscriptionSegmentJSON] | None = None
    words: list[WordJSON] | None = None
    usage: UsageJSON

    @classmethod
    def from_result(
        cls,
        result: TranscriptionResult,
        granularities: Sequence[str] = ("segment",),
        speaker_at: SpeakerAt | None = None,
    ) -> TranscriptionVerboseJSON:
        """Segments unless only `word` was asked for (as OpenAI); words when asked for;
        `speaker_at` (diarize=true) labels each segment and word with its speaker."""
        with_words = "word" in granularities
        with_segments = "segment" in granularities or not with_words
        return cls(
            task=result.task,
            language=result.language_name,
            duration=round(result.duration_s, 3),
            text=result.text,
            words=[WordJSON.of(w, speaker_at) for s in result.segments for w in s.words or ()]
            if with_words
            else None,
            usage=UsageJSON.of(result),
            segments=None
            if not with_segments
            else [
                TranscriptionSegmentJSON(
                    id=s.id,
                    seek=s.seek,
                    start=round(s.start, 3),
                    end=round(s.end, 3),
                    text=s.text,
                    tokens=list(s.tokens),
                    temperature=s.temperature,
                    avg_logprob=s.avg_logprob,
                    compression_ratio=s.compression_ratio,
                    no_speech_prob=s.no_speech_prob,
                    words=[WordJSON.of(w, speaker_at) for w in s.words]
                    if with_words and s.words
                    else None,
                    speaker=speaker_at(s.start, s.end) if speaker_at else None,
                )
                for s in result.segments
            ],
        )


class TextSegmentJSON(BaseModel):
    """One speaker's stretch of a diarized transcript: a `diarized_json` segment, and the SSE
    event `transcript.text.segment` sent as it is finished."""

    type: Literal["transcript.text.segment"] = "transcript.text.segment"
    id: str
    start: float
    end: float
    speaker: str
    text: str

    @classmethod
    def of(cls, index: int, segment: SpeakerSegment) -> TextSegmentJSON:
        return cls(id=f"seg_{index}", start=round(segment.start, 3), end=round(segment.end, 3),
                   speaker=segment.speaker, text=segment.text)  # fmt: skip


class TranscriptionDiarizedJSON(BaseModel):
    """`response_format=diarized_json`."""

    task: Literal["transcribe"] = "transcribe"
    duration: float
    text: str
    segments: list[TextSegmentJSON]
    usage: UsageJSON

    @classmethod
    def from_result(cls, result: DiarizedResult) -> TranscriptionDiarizedJSON:
        transcription = result.transcription
        return cls(
            duration=round(transcription.duration_s, 3),
            text=transcription.text,
            segments=[TextSegmentJSON.of(i, s) for i, s in enumerate(result.segments)],
            usage=UsageJSON.of(transcription),
        )


class TextDeltaEvent(BaseModel):
    """SSE event per decoded token (or small group of tokens); with word timestamps, one per
    word with its `start` and `end` (seconds; an extension)."""

    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str
    start: float | None = None
    end: float | None = None


class TextDoneEvent(BaseModel):
    """Last SSE event of a successful stream, with the whole text."""

    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str
    languages: list[LanguageJSON] | None = None  # as `TranscriptionJSON`'s


class ErrorObject(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorObject


class ErrorEvent(BaseModel):
    """SSE event when a stream fails after it started."""

    type: Literal["error"] = "error"
    error: ErrorObject


class ModelObject(BaseModel):
    """OpenAI's model object; the fields after `owned_by` are this server's."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time the model folder was built (0: not built).")
    owned_by: str = Field(description="The Hub organisation, or stt-openvino.")
    loaded: bool
    state: ModelState = Field(description="available, building, loading, loaded, unloading, failed")
    built: bool = Field(description="A built model folder is on disk (or it is loaded).")
    progress: float | None = Field(default=None, description="0..1 while building.")
    error: str | None = Field(default=None, description="Why the last build or load failed.")
    description: str | None = None
    multilingual: bool | None = Field(
        default=None, description="Knows languages other than English (when loaded)."
    )
    devices: dict[str, str] | None = Field(
        default=None, description="OpenVINO/CPU device per stage (when loaded)."
    )
    memory_bytes: int | None = Field(
        default=None, description="Growth of the server's RSS while it loaded (when loaded)."
    )
    in_use: int = Field(default=0, description="Requests and live sessions using it now.")

    @classmethod
    def from_status(cls, status: ModelStatus) -> ModelObject:
        info = status.info
        org, slash, _ = status.id.partition("/")
        return cls(
            id=status.id,
            created=status.created,
            owned_by=org if slash else "stt-openvino",
            loaded=status.loaded,
            state=status.state,
            built=status.built,
            progress=status.progress,
            error=status.error,
            description=status.description,
            multilingual=info.multilingual if info else None,
            devices=info.devices if info else None,
            memory_bytes=info.memory_bytes if info else None,
            in_use=status.leases,
        )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class HealthModel(BaseModel):
    name: str
    multilingual: bool
    devices: dict[str, str]
    arithmetic: dict[str, str] = Field(
        description="Per stage, what it computes in: the precision, and how the int8-input "
        "layers multiply on this CPU (int8 x int8 where it has int8 dot products, else in float "
        "on their int8 grids)."
    )
    load_s: float
    warmup_s: float
    memory_bytes: int | None = Field(
        default=None, description="Growth of the server's RSS while it loaded and warmed up."
    )


class Health(BaseModel):
    status: Literal["loading", "ready", "failed", "draining", "stopped"]
    error: str | None = None
    default_model: str
    models: list[HealthModel] = Field(default_factory=list)
    workers: int
    max_queue: int
    active: int
    queued: int


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, object]]:
    """OpenAPI `responses` of error statuses, each OpenAI's error shape."""
    return {
        status: {"model": ErrorResponse, "description": description}
        for status, description in descriptions.items()
    }


ERROR_RESPONSES = error_responses({
    400: "Missing or invalid parameter",
    401: "Missing or wrong API key",
    404: "Unknown model",
    413: "Upload too large or audio too long",
    415: "Audio that cannot be decoded",
    429: "Queue full; see Retry-After",
    503: "Models still loading",
})  # fmt: skip
