"""`/v1/voices`: the voice registry — enrol (POST, multipart), list, retrieve and delete.

Behind the API key; off unless `STT_VOICES=true` (403 naming the setting). Enrolment is a job on
the worker pool like a transcription (the diarizer checks the clip and embeds it): a full queue
answers 429. The registry's own failures (locked, disk full, a damaged file) are refusals with
their reason (`app.service.voices.store`).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Depends, File, Form, Path, UploadFile
from pydantic import BaseModel

from app.api.auth import require_api_key
from app.api.deps import PoolDep, SettingsDep, VoicesDep
from app.api.job_http import read_upload
from app.api.schemas import ERROR_RESPONSES, error_responses
from app.service.errors import Rejected
from app.service.voices.registry import Enrolment, VoiceStatus


async def voices_on(settings: SettingsDep) -> None:
    """The registry is served: STT_VOICES on, and the speaker models with it (STT_DIARIZATION)."""
    if not settings.voices or not settings.diarization:
        off = "STT_VOICES=false" if not settings.voices else "STT_DIARIZATION=false"
        raise Rejected(
            "voices_disabled",
            f"The voice registry is off on this server ({off})",
            kind="forbidden",
        )


RESPONSES = ERROR_RESPONSES | error_responses({
    403: "The voice registry is off (STT_VOICES, STT_DIARIZATION)",
    404: "No voice with that id",
    409: "A voice of that name is enrolled already",
    500: "The registry file is damaged",
    503: "The registry is locked by another process; see Retry-After",
    507: "The disk holding the registry is full",
})  # fmt: skip
router = APIRouter(
    prefix="/v1",
    tags=["voices"],
    dependencies=[Depends(require_api_key), Depends(voices_on)],
)


class VoiceObject(BaseModel):
    """An enrolled voice: never its embedding or audio."""

    id: str
    object: str = "voice"
    name: str
    created_at: int
    speech_seconds: float
    audio_kept: bool
    stale: bool  # made by other speaker models, its audio not kept: enrol it again

    @classmethod
    def of(cls, status: VoiceStatus) -> VoiceObject:
        voice = status.voice
        return cls(
            id=voice.id, name=voice.name, created_at=voice.created_at,
            speech_seconds=voice.speech_s, audio_kept=voice.has_audio, stale=status.stale,
        )  # fmt: skip


class VoiceList(BaseModel):
    object: str = "list"
    data: list[VoiceObject]


class VoiceDeleted(BaseModel):
    id: str
    object: str = "voice.deleted"
    deleted: bool = True


START = "Seconds: take the audio from here (a segment of a diarized result)"
KEEP_AUDIO = "Keep the enrolment audio, so the voice is made again when the speaker models change"
VoiceId = Annotated[str, Path(description="A voice's id (voice_...)")]


@router.post("/voices", responses=RESPONSES)
async def enrol_voice(
    registry: VoicesDep,
    pool: PoolDep,
    settings: SettingsDep,
    name: Annotated[str, Form(description="The name diarization gives this voice")],
    file: Annotated[UploadFile, File(description="2-30 s of this one person talking")],
    start: Annotated[float | None, Form(ge=0, description=START)] = None,
    end: Annotated[float | None, Form(gt=0, description="Seconds: take the audio up to here")] = (
        None
    ),
    keep_audio: Annotated[bool, Form(description=KEEP_AUDIO)] = False,
) -> VoiceObject:
    """Enrol a voice from a clip of one person (or its `start`-`end` part)."""
    audio = await read_upload(file, int(settings.max_upload_mb * 2**20))
    enrolment = Enrolment(name, audio, start, end, keep_audio)
    voice = await asyncio.wrap_future(pool.submit(lambda: registry.enrol(enrolment)))
    return VoiceObject.of(VoiceStatus(voice, stale=False))


@router.get("/voices", responses=RESPONSES)
async def list_voices(registry: VoicesDep) -> VoiceList:
    statuses = await asyncio.to_thread(registry.statuses)
    return VoiceList(data=[VoiceObject.of(s) for s in statuses])


@router.get("/voices/{voice_id}", responses=RESPONSES)
async def retrieve_voice(voice_id: VoiceId, registry: VoicesDep) -> VoiceObject:
    return VoiceObject.of(await asyncio.to_thread(registry.status, voice_id))


@router.delete("/voices/{voice_id}", responses=RESPONSES)
async def delete_voice(voice_id: VoiceId, registry: VoicesDep) -> VoiceDeleted:
    await asyncio.to_thread(registry.delete, voice_id)
    return VoiceDeleted(id=voice_id)
