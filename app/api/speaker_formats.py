"""A transcription with speakers in each response format: the one mapping the REST API
(`app/api/diarized.py`) and the CLI (`--diarize --format ...`) both answer with.

`diarized_json` is OpenAI's shape; `verbose_json` puts the speaker on each segment and word
(`diarize=true`); srt names the speaker before each cue's text and vtt makes each cue a voice
span (`<v A>`); json and text (the model `gpt-4o-transcribe-diarize` asked for them) carry no
speaker. JSON formats come back as dicts, the others as text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from app.api.schemas import (
    ResponseFormat,
    TranscriptionDiarizedJSON,
    TranscriptionJSON,
    TranscriptionVerboseJSON,
)
from app.service.diarize.job import DiarizedResult
from app.service.transcription import formats


def diarized_body(
    result: DiarizedResult,
    response_format: ResponseFormat,
    granularities: Sequence[str] = ("segment",),
) -> dict[str, Any] | str:
    """The response body of `result` in `response_format` (granularities: verbose_json's)."""
    transcription = result.transcription
    match response_format:
        case "diarized_json":
            return TranscriptionDiarizedJSON.from_result(result).model_dump()
        case "verbose_json":
            verbose = TranscriptionVerboseJSON.from_result(
                transcription, granularities, result.speaker_at
            )
            return verbose.model_dump(exclude_none=True)
        case "json":
            return TranscriptionJSON.from_result(transcription).model_dump(exclude_none=True)
        case "text":
            return transcription.text + "\n"
        case "srt" | "vtt":
            segments = result.segments
            write = formats.to_srt if response_format == "srt" else formats.to_vtt
            return write(segments, [s.speaker for s in segments])
