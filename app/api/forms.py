"""The multipart form both audio routes read: OpenAI's fields and this server's extras, declared
once as one dependency (`audio_form`) and handed to the handler as one `AudioForm`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import File, Form, UploadFile

from app.api.errors import APIError
from app.api.schemas import Include, ResponseFormat, TimestampGranularity


@dataclass(frozen=True)
class AudioForm:
    """Fields common to `/transcriptions` and `/translations`; None = the server's default.

    The hallucination defences (`vad_filter`, `no_speech_threshold`, `repetition_guard`) are on
    by default (settings `STT_VAD_FILTER`, `STT_NO_SPEECH_THRESHOLD`, `STT_REPETITION_GUARD`).
    """

    file: UploadFile
    model: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: float | None = None
    stream: bool = False
    beam_size: int | None = None
    vad_filter: bool | None = None
    no_speech_threshold: float | None = None
    repetition_guard: bool | None = None
    timestamp_granularities: tuple[TimestampGranularity, ...] = ()
    include: tuple[Include, ...] = ()
    hotwords: str | None = None

    @property
    def word_timestamps(self) -> bool:
        """Words are aligned for `word` granularity and for token log-probs."""
        return "word" in self.timestamp_granularities or "logprobs" in self.include

    def check(self) -> None:
        """OpenAI's rules between fields (a 400 naming the field)."""
        if (
            self.timestamp_granularities
            and self.response_format != "verbose_json"
            and not self.stream  # the stream's deltas carry the words' times
        ):
            raise APIError(
                400,
                "response_format must be set to verbose_json to use timestamp granularities",
                param="timestamp_granularities[]",
                code="invalid_value",
            )
        if self.include and self.response_format != "json":
            raise APIError(
                400,
                "include[]=logprobs is only supported with response_format json",
                param="include[]",
                code="invalid_value",
            )
        if self.include and self.stream:
            raise APIError(
                400,
                "include[]=logprobs is not supported with stream=true",
                param="include[]",
                code="invalid_value",
            )


async def audio_form(
    file: Annotated[
        UploadFile,
        File(description="Audio: flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav, webm, or a video file"),
    ],
    model: Annotated[str | None, Form(description="Model name; default STT_DEFAULT_MODEL")] = None,
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Annotated[float | None, Form(ge=0.0, le=1.0)] = None,
    stream: Annotated[bool, Form(description="Stream the text as Server-Sent Events")] = False,
    beam_size: Annotated[int | None, Form(ge=1, le=16, description="Extra: beam width")] = None,
    vad_filter: Annotated[
        bool | None,
        Form(description="Extra: transcribe only the speech VAD finds (default STT_VAD_FILTER)"),
    ] = None,
    no_speech_threshold: Annotated[
        float | None,
        Form(
            ge=0.0,
            le=1.0,
            description="Extra: skip a 30 s window whose no-speech probability is above it "
            "(default STT_NO_SPEECH_THRESHOLD)",
        ),
    ] = None,
    repetition_guard: Annotated[
        bool | None,
        Form(description="Extra: end a decode stuck in a loop (default STT_REPETITION_GUARD)"),
    ] = None,
    timestamp_granularities: Annotated[
        list[TimestampGranularity] | None,
        Form(
            alias="timestamp_granularities[]",
            description="segment and/or word (verbose_json only); word adds `words`",
        ),
    ] = None,
    include: Annotated[
        list[Include] | None,
        Form(alias="include[]", description="logprobs: each token's log-prob (json only)"),
    ] = None,
    hotwords: Annotated[
        str | None,
        Form(
            max_length=1000,
            description="Extra: names and terms that bias every window's spelling",
        ),
    ] = None,
) -> AudioForm:
    form = AudioForm(
        file=file,
        model=model,
        prompt=prompt,
        response_format=response_format,
        temperature=temperature,
        stream=stream,
        beam_size=beam_size,
        vad_filter=vad_filter,
        no_speech_threshold=no_speech_threshold,
        repetition_guard=repetition_guard,
        timestamp_granularities=tuple(dict.fromkeys(timestamp_granularities or ())),
        include=tuple(dict.fromkeys(include or ())),
        hotwords=hotwords or None,
    )
    form.check()
    return form
