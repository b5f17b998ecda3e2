"""`GET /v1/realtime?intent=transcription`: the OpenAI Realtime transcription protocol.

What OpenAI's clients (the `openai` SDK's `client.realtime.connect`, agent frameworks) speak, in
the GA shape (`session.update` with `session.type = "transcription"`) and the beta shape
(`transcription_session.update`); the reply follows the shape of the client's last update.

Items: the audio of one turn. With `turn_detection` `server_vad` (the default) the server's VAD
cuts turns: `input_audio_buffer.speech_started` opens an item, `speech_stopped` and `committed`
end it; with `turn_detection: null` the client ends an item with `input_audio_buffer.commit`
(the VAD still keeps silence from being decoded). A commit's item holds all the audio sent
before it, also with server VAD on, and completes once the server has read that far: a busy
server may be behind the client, and the pauses it then finds in that audio are not items. While
the person speaks, each word the commit policy makes final is sent at once as
`conversation.item.input_audio_transcription.delta` (append-only); `...completed` holds the
item's whole transcript once everything in it is final; when the session ends on an error (a
limit, an internal failure), each item still waiting for its text gets `...failed` before the
`error` event. `input_audio_buffer.clear` drops the audio not yet committed (`cleared`).
`...completed` names the language the item was read in (`languages`) and, with `include:
["item.input_audio_transcription.logprobs"]`, each token's log-prob. With
`turn_detection.idle_timeout_ms`, that much audio without speech (stream time, as the VAD hears
it, while no item is in flight) gives `input_audio_buffer.timeout_triggered` and an empty item
(committed, completed with no text): a voice agent's cue to prompt the person. An
extension, for the page at `/` and clients that ask with `?partials=true`:
`conversation.item.input_audio_transcription.partial {item_id, text}`, the words after the
deltas that may still change (each replaces the previous one).

With the model `gpt-4o-transcribe-diarize` (or the extension `transcription.speakers: true`),
each completed item's speaker runs follow as `conversation.item.input_audio_transcription.segment`
(labels that hold for the session, or enrolled voices' names: `speakers`).

A client secret (`POST /v1/realtime/client_secrets`, `app.api.live.client_secrets`) opens a
session with the settings it was made with, in place of the server's key.

Formats: `audio/pcm` (16-bit mono; 24 kHz as OpenAI, other rates 8000..192000 as an
extension), `audio/pcmu` and `audio/pcma` (G.711 at 8 kHz). Errors are OpenAI's `error` event;
a field we do not support is named in one and the rest of the update applies. A
`session.update` after audio started applies once the items in flight are completed.
"""

from __future__ import annotations

import base64
import binascii
import logging
import math
import time
from typing import Any

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel

from app.api.auth import CLIENT_SECRET_PREFIX, presented_key, secret_session
from app.api.deps import ServicesDep
from app.api.errors import error_type
from app.api.live.client_secrets import secret_config
from app.api.live.connection import (
    LiveConnection,
    LiveDeps,
    check_size,
    load_json_event,
    serve,
)
from app.api.live.realtime_config import (
    MODEL_PARAM,
    RealtimeConfig,
    apply_beta,
    apply_ga,
    session_beta,
    session_ga,
)
from app.api.live.realtime_events import (
    AudioAppend,
    AudioClear,
    AudioCommit,
    Cleared,
    Committed,
    DurationUsage,
    ErrorDetail,
    ErrorEvent,
    ItemAdded,
    ItemCreated,
    ProtocolError,
    SessionCreated,
    SessionUpdate,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TimeoutTriggered,
    TranscriptionCompleted,
    TranscriptionDelta,
    TranscriptionError,
    TranscriptionFailed,
    TranscriptionPartial,
    TranscriptionSessionUpdated,
    UserAudioItem,
    new_session_id,
    parse_client_event,
)
from app.api.live.realtime_items import Item, Items
from app.api.live.speakers import (
    SpeakerSender,
    diarization_refusal,
    realtime_segments,
    speaker_sender,
)
from app.api.live.stream_options import realtime_default, realtime_options
from app.api.schemas import LanguageJSON, LogprobJSON
from app.service.errors import Rejected
from app.service.live import (
    AudioDecodeError,
    BufferCleared,
    CommittedText,
    Finalized,
    PartialText,
    PcmInput,
    StreamEvent,
    StreamingOptions,
    VoiceActivity,
    ending,
)
from app.service.live import SpeechStarted as SpeechBegan
from app.service.live import SpeechStopped as SpeechEnded
from app.service.models.loaded import LoadedModel

log = logging.getLogger(__name__)

router = APIRouter(tags=["streaming"])


def error_event(error: Rejected) -> ErrorEvent:
    """OpenAI's `error` event; a refused client event is named by its id."""
    event_id = error.event_id if isinstance(error, ProtocolError) else None
    detail = ErrorDetail(type=error_type(error), code=error.code, message=error.message,
                         param=error.param, event_id=event_id)  # fmt: skip
    return ErrorEvent(error=detail)


class RealtimeConnection(LiveConnection):
    def __init__(self, websocket: WebSocket, deps: LiveDeps) -> None:
        super().__init__(websocket, deps)
        self.session_id = new_session_id()
        self.config = realtime_default(deps.defaults)
        secret = presented_key(websocket)
        if secret is not None and secret.startswith(CLIENT_SECRET_PREFIX):  # checked at the door
            session = secret_session(self.settings.api_key, secret, now=time.time())
            self.config = secret_config(session, self.config)
        self.model, self.options = self._resolve(self.config)
        self.beta = False  # reply in the beta shape (the client sent transcription_session.update)
        self.items = Items()
        self.audio_since_commit = False
        self.clears = 0  # client clears the session has not carried out yet
        self.quiet_from_s: float | None = 0.0  # where the VAD's silence began; None: speech
        self.partials = websocket.query_params.get("partials", "").lower() in ("1", "true")
        self.speakers: SpeakerSender | None = None  # with config.diarize: who is who, kept

    # ---- configuration ------------------------------------------------------------------
    def session_object(self) -> dict[str, Any]:
        if self.beta:
            return session_beta(self.config, self.session_id)
        return session_ga(self.config, self.session_id)

    def describe(self) -> str:
        return f"realtime {self.session_object()}"

    def greeting(self) -> BaseModel:
        return SessionCreated(session=session_ga(self.config, self.session_id))

    def error_event(self, error: Rejected) -> BaseModel:
        return error_event(error)

    async def _update(self, session: dict[str, Any], event_id: str | None, *, beta: bool) -> None:
        apply = apply_beta if beta else apply_ga
        config, problems = apply(self.config, session, event_id=event_id)
        for problem in problems:
            self.outbox.put(problem.event())
        if any(p.code == "invalid_value" for p in problems):
            return  # rejected whole
        model, options = self._resolve(config)
        if config != self.config and self.runner is not None:
            if self.items.in_flight() or self.audio_since_commit:
                raise Rejected(
                    "session_busy", "the session changes once the audio in flight is "
                    "transcribed: commit or clear it first",
                )  # fmt: skip
            runner, self.runner = self.runner, None
            await runner.stop()  # idle: the next audio starts one with the new settings
        self.config, self.beta = config, beta
        self.model, self.options = model, options
        answer = TranscriptionSessionUpdated if beta else SessionUpdated
        self.outbox.put(answer(session=self.session_object()))

    def _resolve(self, config: RealtimeConfig) -> tuple[LoadedModel, StreamingOptions]:
        """The loaded model `config` names and the session's options on it."""
        if config.diarize and (
            refusal := diarization_refusal(self.settings, self.deps.diarizer, MODEL_PARAM)
        ):
            raise refusal
        try:
            model = self.deps.models.get(config.model)
        except Rejected as e:
            raise Rejected(e.code, e.message, param=MODEL_PARAM, kind=e.kind) from e
        return model, realtime_options(config, model, self.deps.defaults)

    def _live_speakers(self) -> SpeakerSender | None:
        """The session's speakers while it asks for them (kept across runners)."""
        if not self.config.diarize:
            return None
        if self.speakers is None:
            return speaker_sender(self.deps, realtime_segments, self.outbox.put, self.say)
        self.speakers.new_stream()
        return self.speakers

    # ---- client events ------------------------------------------------------------------
    async def handle(self, message: dict[str, Any]) -> bool:
        data = message.get("bytes")
        if data is not None:
            raise Rejected(
                "invalid_message", "send audio as input_audio_buffer.append events (base64 in JSON)"
            )
        text = message.get("text")
        if text is None:
            raise Rejected("invalid_message", "empty message")
        check_size(len(text), self.max_frame)
        event = parse_client_event(load_json_event(text))
        try:
            match event:
                case AudioAppend(audio=audio):
                    self._append(audio)
                    if self._idle_since() is not None and self.runner is not None:
                        await self.runner.heard()  # speech in the audio not yet heard?
                        self._idle()
                case AudioCommit():
                    self._commit()
                case AudioClear():
                    self._clear()
                case SessionUpdate(session=session, event_id=event_id):
                    await self._update(session, event_id, beta=False)
                case _:  # TranscriptionSessionUpdate
                    await self._update(event.session, event.event_id, beta=True)
        except Rejected as e:
            if ending(e) is not None or isinstance(e, ProtocolError):
                raise
            raise ProtocolError(e.message, e.code, e.param, event.event_id) from e  # names it
        return False

    def _append(self, audio: str) -> None:
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError) as e:
            raise Rejected("invalid_audio", f"'audio' is not valid base64: {e}",
                           param="audio") from e  # fmt: skip
        if self.runner is None:
            pcm = PcmInput(self.config.encoding, self.config.rate)
            self.start_runner(self.model, self.options, pcm)
            self.speakers = self._live_speakers()
        assert self.runner is not None
        try:
            samples = self.runner.convert(data)
        except AudioDecodeError as e:
            raise Rejected("invalid_audio", f"audio dropped: {e}", param="audio") from e
        self.runner.feed(samples)
        if self.speakers is not None:
            self.speakers.hear(samples)
        self.audio_since_commit = self.audio_since_commit or bool(data)
        if self.items.open is None and self.config.turn_detection is None and data:
            self.items.start()  # without turns, the audio since the last commit is the next item

    def _idle_since(self) -> float | None:
        """Where the silence began, when `idle_timeout_ms` of audio went by without speech (as
        far as the VAD heard) and no item is in flight; else None."""
        turns = self.config.turn_detection
        if turns is None or turns.idle_timeout_ms is None or self.options.vad is None:
            return None  # (no VAD: no speech is ever heard; the client commits turns)
        if self.quiet_from_s is None:
            return None
        if self.items.in_flight():
            return None
        start_s = max(self.quiet_from_s, self.items.mark_s)
        return start_s if self._now_s() - start_s >= turns.idle_timeout_ms / 1000 else None

    def _idle(self) -> None:
        """The silence is an empty item: timeout_triggered, committed, completed."""
        start_s, now = self._idle_since(), self._now_s()
        if start_s is None:
            return
        item = self.items.start(start_s)
        start_ms, end_ms = round(start_s * 1000), round(now * 1000)
        self.outbox.put(TimeoutTriggered(audio_start_ms=start_ms, audio_end_ms=end_ms,
                                         item_id=item.id))  # fmt: skip
        self._end_item(item, now)
        self.audio_since_commit = False
        self._complete(now)

    def _commit(self) -> None:
        if self.runner is None or not self.audio_since_commit:
            raise Rejected("input_audio_buffer_commit_empty",
                           "the input audio buffer is empty: nothing to commit")  # fmt: skip
        self.audio_since_commit = False
        self._end_item(self.items.open or self.items.start())
        self.runner.commit()

    def _clear(self) -> None:
        """The audio not committed is dropped; `cleared` once the session has done it (text it
        commits meanwhile came from the dropped audio)."""
        self.items.clear(self._now_s())
        self.audio_since_commit = False
        if self.runner is None:
            self.outbox.put(Cleared())
            return
        self.clears += 1
        self.runner.clear()

    # ---- items --------------------------------------------------------------------------
    def _now_s(self) -> float:
        return self.runner.received_s if self.runner is not None else 0.0

    def _end_item(self, item: Item, end_s: float | None = None) -> None:
        """The item's audio is complete: `committed` and the item; its text follows."""
        previous = self.items.end(item, self._now_s() if end_s is None else end_s)
        self.outbox.put(Committed(item_id=item.id, previous_item_id=previous))
        added = ItemCreated if self.beta else ItemAdded
        self.outbox.put(added(previous_item_id=previous, item=UserAudioItem(id=item.id)))

    def _text_item(self) -> Item:
        """The item text goes to, opened here for words after a commit the session heard before
        the turn's start."""
        item = self.items.for_text()
        if item is None:
            item = self.items.start()
            if self.config.turn_detection is not None:
                started = SpeechStarted(audio_start_ms=round(item.start_s * 1000), item_id=item.id)
                self.outbox.put(started)
        return item

    def _complete(self, at: float) -> None:
        """The items whose audio ends by `at` (stream seconds) have all their text: completed.
        A session behind real time finalizes pauses in audio the client has since committed;
        that item waits for the finalization of its own end."""
        token_bytes = self.model.tokenizer.token_bytes
        for item in self.items.done_by(at):
            self.outbox.put(TranscriptionCompleted(
                item_id=item.id, transcript="".join(item.text).strip(),
                usage=DurationUsage(seconds=item.seconds),
                languages=LanguageJSON.listed(item.language),
                logprobs=LogprobJSON.of_words(item.words, token_bytes) if self.config.logprobs
                else None,
            ))  # fmt: skip
            if self.speakers is not None:
                self.speakers.item(item.id, item.start_s, item.end_s or item.start_s, item.words)

    # ---- session events -----------------------------------------------------------------
    def on_event(self, event: StreamEvent) -> None:
        turns = self.config.turn_detection
        match event:
            case VoiceActivity(kind=kind, at=at):
                self.quiet_from_s = at if kind == "end" else None  # a pause is inside speech
            case SpeechBegan(at=at) if (
                turns is not None and not self.clears and at >= self.items.mark_s
            ):
                start_s = max(at - turns.prefix_padding_ms / 1000, 0.0)
                item = self.items.open or self.items.start(start_s)
                started = SpeechStarted(audio_start_ms=round(start_s * 1000), item_id=item.id)
                self.outbox.put(started)
            case SpeechEnded(at=at) if turns is not None and self.items.open is not None:
                item = self.items.open
                self.outbox.put(SpeechStopped(audio_end_ms=round(at * 1000), item_id=item.id))
                self._end_item(item, at)
                self.audio_since_commit = False
            case BufferCleared():
                self.clears = max(self.clears - 1, 0)
                self.outbox.put(Cleared())
            case CommittedText() if self.clears and not self.items.ended:
                pass  # from audio the client cleared
            case PartialText(text=text) if (
                self.partials and not self.clears and (text or self.items.in_flight())
            ):
                item = self._text_item()
                partial = TranscriptionPartial(item_id=item.id, text=text)
                self.outbox.put(partial, replaceable=True)
            case CommittedText(text=text, words=words, language=language):
                item = self._text_item()
                if not item.text:
                    text = text.lstrip()
                item.text.append(text)
                item.words.extend(words)
                item.language = language
                self.outbox.put(TranscriptionDelta(item_id=item.id, delta=text))
            case Finalized(reason=reason, at=at) if reason == "flush" or turns is not None:
                self._complete(at)

    def failed(self, error: Rejected) -> None:
        """Every item the client knows of and still waits for (committed, or open with deltas
        sent) gets `...transcription.failed` with the session's error."""
        waiting = self.items.waiting()
        reason = TranscriptionError(type=error_type(error), code=error.code, message=error.message)
        for item in waiting:
            self.outbox.put(TranscriptionFailed(item_id=item.id, error=reason))

    async def finish(self) -> None:
        """Shutdown: the item being spoken is committed and completed before the close."""
        if self.runner is None:
            return
        if self.items.open is not None and self.audio_since_commit:
            self._end_item(self.items.open)
        await self.close_runner()
        item = self.items.open
        if item is not None and item.text:  # its first words came with the last pass
            self._end_item(item)
        self._complete(math.inf)
        if self.speakers is not None:
            await self.speakers.drain()  # the last items' speakers before the close


@router.websocket("/v1/realtime")
async def realtime(websocket: WebSocket, services: ServicesDep) -> None:
    """The OpenAI Realtime transcription protocol; see the module docstring."""
    await serve(websocket, services, error_event, RealtimeConnection, client_secrets=True)
