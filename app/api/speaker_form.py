"""The transcription form's speaker fields (OpenAI's diarization fields and this server's extras),
read once as one dependency (`speaker_form`) beside the audio form.

Diarization runs for `response_format=diarized_json`, for the model `gpt-4o-transcribe-diarize`
(the default model with speakers) and for `diarize=true` (speakers on verbose_json, srt and vtt).
Known speakers come as `known_speaker_names[]` with as many `known_speaker_references[]`, each a
data URL of a 2-10 s clip in any upload format; with the voice registry on (STT_VOICES), the
names after those with a clip name enrolled voices (`/v1/voices`). `chunking_strategy` ("auto"
or a server_vad object) is accepted and checked: this server always cuts long audio at silences
itself. With the setting STT_DIARIZATION off, a request asking for speakers is a 403 naming it.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Form

from app.api.deps import SettingsDep
from app.api.forms import AudioForm, audio_form
from app.service.diarize.clustering import MAX_SPEAKERS, SpeakerHints
from app.service.diarize.job import SpeakerJob, known_clips
from app.service.errors import Rejected

DIARIZE_MODEL = "gpt-4o-transcribe-diarize"  # OpenAI's diarizing model = the default + speakers
MAX_KNOWN_SPEAKERS = 4  # OpenAI's limit
NAMES = "known_speaker_names[]"
REFERENCES = "known_speaker_references[]"
PLAIN_FORMATS = ("json", "text")  # no place for a speaker


@dataclass(frozen=True)
class SpeakerForm:
    """A request that asked for speakers: the model to run (None = the default) and the job."""

    model: str | None
    job: SpeakerJob


def _invalid(message: str, param: str) -> Rejected:
    return Rejected("invalid_value", message, param=param)


def decode_data_url(url: str, index: int) -> bytes:
    """The bytes of a base64 data URL (`data:audio/wav;base64,...`)."""
    header, comma, payload = url.partition(",")
    if not (comma and header.startswith("data:") and header.endswith(";base64")):
        raise _invalid(
            f"known_speaker_references[{index}] must be a base64 data URL "
            "(data:<audio type>;base64,<data>)",
            REFERENCES,
        )
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as e:
        raise _invalid(f"known_speaker_references[{index}] is not valid base64: {e}",
                       REFERENCES) from e  # fmt: skip
    if not data:
        raise _invalid(f"known_speaker_references[{index}] is empty", REFERENCES)
    return data


def known_speakers(
    names: list[str] | None, references: list[str] | None, voices: bool
) -> tuple[tuple[tuple[str, bytes], ...], tuple[str, ...]]:
    """Names paired with their decoded reference clips, and the names after them that have no
    clip (enrolled voices: only with the voice registry on); a 400 naming the field if they do
    not pair up."""
    names, references = names or [], references or []
    if len(names) < len(references) or (len(names) > len(references) and not voices):
        raise _invalid(
            f"known_speaker_names[] ({len(names)}) and known_speaker_references[] "
            f"({len(references)}) must have the same number of entries"
            + ("" if voices else " (names of enrolled voices need STT_VOICES=true)"),
            NAMES if len(names) < len(references) else REFERENCES,
        )
    if len(names) > MAX_KNOWN_SPEAKERS:
        raise _invalid(f"at most {MAX_KNOWN_SPEAKERS} known speakers, got {len(names)}", NAMES)
    cleaned = [n.strip() for n in names]
    if any(not n for n in cleaned):
        raise _invalid("known_speaker_names[] must not hold an empty name", NAMES)
    if len(set(cleaned)) != len(cleaned):
        raise _invalid("known_speaker_names[] must not name a speaker twice", NAMES)
    pairs = enumerate(zip(cleaned, references, strict=False))
    clips = tuple((name, decode_data_url(url, i)) for i, (name, url) in pairs)
    return clips, tuple(cleaned[len(references) :])


def _asked_by(form: AudioForm, alias: bool) -> str:
    """The request field that asked for speakers."""
    if form.response_format == "diarized_json":
        return "response_format"
    return "model" if alias else "diarize"


def speaker_form(
    form: Annotated[AudioForm, Depends(audio_form)],
    settings: SettingsDep,
    known_speaker_names: Annotated[
        list[str] | None,
        Form(alias=NAMES, description="Names of up to 4 known speakers (diarized_json)"),
    ] = None,
    known_speaker_references: Annotated[
        list[str] | None,
        Form(
            alias=REFERENCES,
            description="A data URL of a 2-10 s clip of each known speaker, any audio format",
        ),
    ] = None,
    chunking_strategy: Annotated[
        Literal["auto"] | None,
        Form(description='"auto" or a server_vad object: accepted; long audio is always cut'),
    ] = None,
    chunking_type: Annotated[
        Literal["server_vad"] | None, Form(alias="chunking_strategy[type]")
    ] = None,
    chunking_threshold: Annotated[
        float | None, Form(alias="chunking_strategy[threshold]", ge=0.0, le=1.0)
    ] = None,
    chunking_prefix_ms: Annotated[
        int | None, Form(alias="chunking_strategy[prefix_padding_ms]", ge=0)
    ] = None,
    chunking_silence_ms: Annotated[
        int | None, Form(alias="chunking_strategy[silence_duration_ms]", ge=0)
    ] = None,
    diarize: Annotated[
        bool,
        Form(description="Extra: speakers on verbose_json (segments and words), srt and vtt"),
    ] = False,
    num_speakers: Annotated[
        int | None, Form(ge=1, le=MAX_SPEAKERS, description="Extra: how many speakers talk")
    ] = None,
    min_speakers: Annotated[
        int | None, Form(ge=1, le=MAX_SPEAKERS, description="Extra: at least this many speakers")
    ] = None,
    max_speakers: Annotated[
        int | None, Form(ge=1, le=MAX_SPEAKERS, description="Extra: at most this many speakers")
    ] = None,
) -> SpeakerForm | None:
    """The speaker request, or None when the request does not ask for speakers (the
    chunking_strategy fields are only checked: the transcriber always cuts at silences)."""
    alias = form.model is not None and form.model.strip() == DIARIZE_MODEL
    wanted = alias or diarize or form.response_format == "diarized_json"
    asked = {
        NAMES: known_speaker_names,
        REFERENCES: known_speaker_references,
        "num_speakers": num_speakers,
        "min_speakers": min_speakers,
        "max_speakers": max_speakers,
    }
    if not wanted:
        extra = next((name for name, value in asked.items() if value), None)
        if extra is not None:
            raise _invalid(
                f"{extra} needs diarization: set response_format=diarized_json, the model "
                f"{DIARIZE_MODEL} or diarize=true",
                extra,
            )
        return None
    if not settings.diarization:
        raise Rejected(
            "diarization_disabled",
            "Speaker diarization is off on this server (STT_DIARIZATION=false): "
            "diarized_json, diarize=true and the model gpt-4o-transcribe-diarize are not served",
            param=_asked_by(form, alias),
            kind="forbidden",
        )
    if diarize and not alias and form.response_format in PLAIN_FORMATS:
        raise _invalid(
            "diarize=true adds speakers to verbose_json, srt and vtt; use "
            "response_format=diarized_json for speaker segments",
            "diarize",
        )
    try:
        hints = SpeakerHints(num_speakers, min_speakers, max_speakers)
    except ValueError as e:
        raise _invalid(str(e), "num_speakers" if num_speakers else "min_speakers") from e
    clips, voices = known_speakers(known_speaker_names, known_speaker_references, settings.voices)
    job = SpeakerJob(hints, known_clips(clips), voices)
    return SpeakerForm(model=None if alias else form.model, job=job)
