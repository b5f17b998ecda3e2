"""The multipart form both audio routes read: OpenAI's fields and this server's extras, declared
once as one dependency (`audio_form`) and handed to the handler as one `AudioForm`, which builds
the job's transcriber options (`AudioForm.options`): the one place a request becomes options.

Ranges are checked by the form fields (a 400 naming the field); the model's own rules (its
languages, translation on an English-only model, VAD installed) by `options`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated

from fastapi import File, Form, UploadFile

from app.api.schemas import Include, ResponseFormat, TimestampGranularity
from app.service.errors import Rejected
from app.service.models.loaded import LoadedModel
from app.service.transcription.options import (
    MAX_REQUEST_BEAM_SIZE,
    MAX_REQUEST_TEMPERATURE,
    Task,
    TranscriptionOptions,
    language_choice,
    model_task,
)

# Beam search can only release a token once every beam agrees on it (often at the end of the
# window); greedy decoding releases text as soon as each segment closes.
STREAM_DEFAULT_BEAM_SIZE = 1  # stream=true without beam_size decodes greedily, for latency
LANGUAGES = "languages[]"


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
    keywords: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()

    @property
    def word_timestamps(self) -> bool:
        """Words are aligned for `word` granularity and for token log-probs."""
        return "word" in self.timestamp_granularities or "logprobs" in self.include

    def options(
        self, model: LoadedModel, *, task: Task, language: str | None
    ) -> TranscriptionOptions:
        """The transcriber options of this request on `model`: the server's defaults with what
        the client set; raises `Rejected` for what the model cannot do."""
        spoken, candidates = language_choice(
            model.name, model.multilingual, language, self.languages,
            params=("language", LANGUAGES),
        )  # fmt: skip
        changes: dict[str, object] = {
            "language": spoken,
            "task": model_task(model.multilingual, task),
        }
        if candidates:
            changes["languages"] = candidates
        if self.prompt:
            changes["initial_prompt"] = self.prompt
        if self.temperature:  # None or 0: the fallback schedule
            changes["temperature"] = (self.temperature,)
        beam_size = self.beam_size
        if beam_size is None and self.stream:
            beam_size = STREAM_DEFAULT_BEAM_SIZE
        if beam_size is not None:
            changes["beam_size"] = beam_size
        if self.vad_filter and not model.vad_available:
            raise Rejected(
                "vad_unavailable",
                "vad_filter is unavailable: the VAD model is not installed on this server "
                "(`python -m app.export vad`)",
                param="vad_filter",
            )
        optional = {
            "vad_filter": self.vad_filter,
            "no_speech_threshold": self.no_speech_threshold,
            "repetition_guard": self.repetition_guard,
            "hotwords": ", ".join(
                w.strip() for w in (self.hotwords, *self.keywords) if w and w.strip()
            ),
        }
        changes.update({k: v for k, v in optional.items() if v is not None and v != ""})
        if self.word_timestamps:
            changes["word_timestamps"] = True
        return replace(model.base_options, **changes)

    def check(self) -> None:
        """OpenAI's rules between fields (a 400 naming the field)."""
        if (
            self.timestamp_granularities
            and self.response_format != "verbose_json"
            and not self.stream  # the stream's deltas carry the words' times
        ):
            raise Rejected(
                "invalid_value",
                "response_format must be set to verbose_json to use timestamp granularities",
                param="timestamp_granularities[]",
            )
        if self.include and self.response_format != "json":
            raise Rejected(
                "invalid_value",
                "include[]=logprobs is only supported with response_format json",
                param="include[]",
            )
        if self.include and self.stream:
            raise Rejected(
                "invalid_value",
                "include[]=logprobs is not supported with stream=true",
                param="include[]",
            )


async def audio_form(
    file: Annotated[
        UploadFile,
        File(description="Audio: flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav, webm, or a video file"),
    ],
    model: Annotated[str | None, Form(description="Model name; default STT_DEFAULT_MODEL")] = None,
    prompt: Annotated[str | None, Form()] = None,
    response_format: Annotated[ResponseFormat, Form()] = "json",
    temperature: Annotated[float | None, Form(ge=0.0, le=MAX_REQUEST_TEMPERATURE)] = None,
    stream: Annotated[bool, Form(description="Stream the text as Server-Sent Events")] = False,
    beam_size: Annotated[
        int | None, Form(ge=1, le=MAX_REQUEST_BEAM_SIZE, description="Extra: beam width")
    ] = None,
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
    keywords: Annotated[
        list[str] | None,
        Form(alias="keywords[]", description="Words or phrases that guide the spelling (hotwords)"),
    ] = None,
    languages: Annotated[
        list[str] | None,
        Form(alias=LANGUAGES, description="Detect the language among these (ISO-639-1 codes)"),
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
        keywords=tuple(keywords or ()),
        languages=tuple(languages or ()),
    )
    form.check()
    return form
