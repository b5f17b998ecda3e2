"""Request/response shapes, matching OpenAI's Audio API field for field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from app.service.registry import ModelInfo, TranscriptionResult

ResponseFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
TimestampGranularity = Literal["segment", "word"]


class TranscriptionJSON(BaseModel):
    """`response_format=json`."""

    text: str


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


class TranscriptionVerboseJSON(BaseModel):
    """`response_format=verbose_json`."""

    task: Literal["transcribe", "translate"]
    language: str  # English name, e.g. "english", as OpenAI reports it
    duration: float  # seconds of audio
    text: str
    segments: list[TranscriptionSegmentJSON]

    @classmethod
    def from_result(cls, result: TranscriptionResult) -> TranscriptionVerboseJSON:
        return cls(
            task=result.task,
            language=result.language_name,
            duration=round(result.duration_s, 3),
            text=result.text,
            segments=[
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
                )
                for s in result.segments
            ],
        )


class TextDeltaEvent(BaseModel):
    """SSE event per decoded token (or small group of tokens)."""

    type: Literal["transcript.text.delta"] = "transcript.text.delta"
    delta: str


class TextDoneEvent(BaseModel):
    """Last SSE event of a successful stream, with the whole text."""

    type: Literal["transcript.text.done"] = "transcript.text.done"
    text: str


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
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "stt-openvino"
    multilingual: bool = Field(description="Knows languages other than English; can translate.")
    devices: dict[str, str] = Field(description="OpenVINO/CPU device per stage.")

    @classmethod
    def from_info(cls, info: ModelInfo) -> ModelObject:
        return cls(
            id=info.name, created=info.created, multilingual=info.multilingual, devices=info.devices
        )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class HealthModel(BaseModel):
    name: str
    multilingual: bool
    devices: dict[str, str]
    load_s: float
    warmup_s: float


class Health(BaseModel):
    status: Literal["loading", "ready", "failed"]
    error: str | None = None
    default_model: str
    models: list[HealthModel] = Field(default_factory=list)
    workers: int
    max_queue: int
    active: int
    queued: int


ERROR_RESPONSES: dict[int | str, dict[str, object]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Missing or invalid parameter",
        401: "Missing or wrong API key",
        404: "Unknown model",
        413: "Upload too large or audio too long",
        415: "Audio that cannot be decoded",
        429: "Queue full; see Retry-After",
        503: "Models still loading",
    }.items()
}
