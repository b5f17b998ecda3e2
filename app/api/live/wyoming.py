"""Home Assistant's Wyoming protocol: speech-to-text over TCP on the same models, scheduler and
limits as the HTTP API (`STT_WYOMING_PORT`; off when empty).

One connection at a time per client, events framed by the `wyoming` package:

    describe                      -> info (an `asr` program: the models, their languages,
                                     whether the server ends commands itself)
    transcribe {name, language, vad_sensitivity}
                                  -> (model, language, end of command of the next utterance;
                                     optional)
    audio-start {rate, width, channels}
                                  -> transcript-start {language}
    audio-chunk ... (PCM)         -> transcript-chunk {text} as words are committed, while the
                                     person speaks (the live-session core the WebSocket uses)
    (the end of the turn)         -> transcript {text, language[, context]}, transcript-stop:
                                     with STT_WYOMING_ENDPOINTING (default on, with the VAD
                                     model)
    audio-stop                    -> transcript {text, language[, context]}, transcript-stop,
                                     unless the end of the turn answered already

With STT_WYOMING_SPEAKERS the transcript's context says who said the command: `{"speaker":
name}`, an enrolled voice's name (STT_VOICES) or a label `A`, `B`, ... that holds for the
connection (`speakers.py`); the speaker models run beside the transcript's pass.

Endpointing: the server tells Home Assistant it needs no external VAD
(`requires_external_vad: false`), hears where the command ends (the live session's end of
turn: semantic turn detection with the turn model, `vad_sensitivity` relaxed / default /
aggressive as its eagerness low / auto / high; without it the VAD's silence, 1.25 / 0.7 /
0.25 s as Home Assistant's own VAD) and answers then; audio sent after that, before
`audio-stop`, is past the command and not transcribed.

The `transcript` is the whole utterance transcribed as an uploaded file is (greedy, the server's
defences), on the shared worker pool, started as soon as the speaker pauses
(`app/service/live/utterance.py`): the chunks come early from the live session and may differ
from it by a word; the transcript is the text to act on. An utterance longer than
`FINAL_PASS_MAX_S` keeps the live session's text instead (its audio is not held). Each
utterance is a live session of the live host (`app/service/live/host.py`): admitted at
`audio-start` (loading, shutting down, `STT_STREAM_MAX_SESSIONS`: an `error` event, then the
connection closes), its runner and limits, its close table.

Audio in any rate (8-192 kHz), sample width (1, 2 or 4 bytes) and channel count (averaged) the
`audio-start` announces. Bad input gets an `error` event {text, code}: an unknown event, a chunk
before `audio-start` or in another format than announced, an unsupported format, an unknown
model or language; the connection goes on. What ends a live session (the host's table: a header
or chunk larger than `STT_STREAM_MAX_FRAME_KB`, a client silent for `STT_STREAM_IDLE_TIMEOUT_S`,
a session limit, a refused admission) or more than `STT_WYOMING_MAX_CLIENTS` connections: an
`error` event, then the connection closes.

Trust model: like Home Assistant's own Wyoming servers there is no authentication (the protocol
has none): bind it to a LAN or a host-only address you trust (`STT_WYOMING_HOST`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncTcpServer

from app.api.discovery import WyomingAnnouncement
from app.api.live.connection import LiveDeps
from app.api.live.speakers import SessionSpeakers, live_speakers
from app.api.live.stream_options import wyoming_options, wyoming_sensitivity
from app.api.live.wyoming_framing import BoundedReader, close_gently
from app.api.services import Services
from app.service.errors import Rejected
from app.service.live import (
    AudioDecodeError,
    CommittedText,
    Finalized,
    FramedPcm,
    LiveRunner,
    Outbox,
    StreamEvent,
    VoiceActivity,
    ending,
)
from app.service.live.utterance import Utterance
from app.service.models.leases import SessionModels
from app.service.models.loaded import LoadedModel
from app.service.transcription.options import model_language, model_languages

log = logging.getLogger(__name__)

FINAL_PASS_MAX_S = 120.0  # utterances up to this long get the whole-utterance transcript
ATTRIBUTION = Attribution(name="OpenAI", url="https://github.com/openai/whisper")
PROGRAM = Attribution(name="stt-openvino", url="https://github.com/openai/whisper")


class WyomingServer:
    """The TCP server, started and stopped by the app's lifespan."""

    def __init__(self, services: Services) -> None:
        self.services = services
        settings = services.settings
        self.settings = settings
        self.clients = 0
        self._server = AsyncTcpServer(settings.wyoming_host, settings.wyoming_port or 0)
        self._announcement = (
            WyomingAnnouncement(
                settings.wyoming_zeroconf, settings.wyoming_port or 0, settings.wyoming_host
            )
            if settings.wyoming_zeroconf
            else None
        )

    async def start(self) -> None:
        await self._server.start(self._handler)
        log.info(
            "Wyoming protocol on %s:%s", self.settings.wyoming_host, self.settings.wyoming_port
        )
        if self._announcement is not None:
            await self._announcement.start()

    async def stop(self) -> None:
        if self._announcement is not None:
            await self._announcement.stop()
        await self._server.stop()

    def _handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> SttHandler:
        return SttHandler(reader, writer, self, self.services)


@dataclass
class _InFlight:
    """One utterance in flight: its admission by the live host, its format, its session;
    `endpoint`: its end of turn answers it; `worded`: the session committed words;
    `answer`: the answer under way once its turn ended (audio after it is past the command)."""

    deps: LiveDeps
    pcm: FramedPcm
    utterance: Utterance
    endpoint: bool
    worded: bool = False
    answer: asyncio.Task[None] | None = None

    async def end(self) -> None:
        await self.utterance.close()
        self.deps.admission.close()


class SttHandler:
    """One Wyoming connection: reads events, runs one utterance at a time."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        server: WyomingServer,
        services: Services,
    ) -> None:
        settings = services.settings
        self.reader = BoundedReader(reader, settings.stream_max_frame_kb * 1024)
        self.writer = writer
        self.server = server
        self.services = services
        self.models = SessionModels(services.models)  # what `transcribe` names, until the end
        self.idle_timeout = settings.stream_idle_timeout_s
        self.model_name: str | None = None  # None = the default model
        self.language: str | None = None
        self.sensitivity = "default"  # transcribe's vad_sensitivity (endpointing)
        self.current: _InFlight | None = None
        self.speakers: SessionSpeakers | None = None  # STT_WYOMING_SPEAKERS: the connection's
        self.outbox: Outbox[Event] = Outbox()
        self._sender = asyncio.create_task(self._send(), name="wyoming-sender")

    async def stop(self) -> None:
        """The server stops (`AsyncServer.stop` calls this): drop the connection."""
        with contextlib.suppress(Exception):
            self.writer.close()

    async def run(self) -> None:
        server = self.server
        server.clients += 1
        try:
            if server.clients > server.settings.wyoming_max_clients:
                limit = server.settings.wyoming_max_clients
                message = f"the server serves at most {limit} Wyoming clients"
                self._error(Rejected("busy", message, kind="busy"))
                return
            await self._serve()
        except Exception:
            log.exception("wyoming: the connection failed")
        finally:
            server.clients -= 1
            await self._end_utterance()
            await self.outbox.wait_sent(self._sender)
            self._sender.cancel()
            await close_gently(self.reader.reader, self.writer)
            self.models.close()

    async def _serve(self) -> None:
        """Events until the client closes or a refusal ends the session (the host's table)."""
        while True:
            try:
                event = await asyncio.wait_for(
                    async_read_event(self.reader),  # type: ignore[arg-type]
                    self.idle_timeout,
                )
                if event is None:  # the client closed, or sent a line that is not JSON
                    return
            except TimeoutError:
                message = f"no event for {self.idle_timeout:g} s"
                self._error(Rejected("idle_timeout", message, kind="limit"))
                return
            except (ConnectionError, asyncio.IncompleteReadError):
                return
            except Rejected as e:  # an oversized event
                self._error(e)
                return
            try:
                await self._handle(event)
            except Rejected as e:
                self._error(e)
                if ending(e) is not None:
                    return

    # ---- events -------------------------------------------------------------------------
    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            self.outbox.put(self._info().event())
        elif Ping.is_type(event.type):
            self.outbox.put(Pong(text=Ping.from_event(event).text).event())
        elif Transcribe.is_type(event.type):
            request = Transcribe.from_event(event)
            model = self._model(self.models, request.name)
            model_language(model.name, model.multilingual, request.language)  # checked now
            sensitivity = wyoming_sensitivity(request.vad_sensitivity)
            self.model_name, self.language = request.name, request.language
            self.sensitivity = sensitivity
        elif AudioStart.is_type(event.type):
            await self._start(AudioStart.from_event(event))
        elif AudioChunk.is_type(event.type):
            self._chunk(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            await self._stop()
        else:
            raise Rejected("unknown_event", f"unknown event type {event.type!r}")

    def _info(self) -> Info:
        models = []
        for name in self.services.settings.models:
            info = self.models.info(name)
            loaded = info is not None
            multilingual = info is not None and info.multilingual
            models.append(AsrModel(
                name=name, description=f"Whisper {name} (OpenVINO)", attribution=ATTRIBUTION,
                installed=loaded, version=None,
                languages=model_languages(multilingual) if loaded else [],
            ))  # fmt: skip
        program = AsrProgram(
            name="stt-openvino",
            description="Whisper speech-to-text on OpenVINO (NPU, GPU, CPU)",
            attribution=PROGRAM,
            installed=True,
            version=None,
            models=models,
            supports_transcript_streaming=True,
            requires_external_vad=not self._endpointing,
            prefers_auto_gain_enabled=False,  # the front end does not depend on the level
            prefers_noise_reduction_enabled=False,
        )
        return Info(asr=[program])

    @property
    def _endpointing(self) -> bool:
        """The server ends commands itself: the setting is on and the VAD model loaded."""
        return self.services.settings.wyoming_endpointing and self.models.vad is not None

    def _model(self, models: SessionModels, name: str | None) -> LoadedModel:
        self.services.gate.check("session")
        return models.get(name or None)

    async def _start(self, start: AudioStart) -> None:
        await self._end_utterance()
        try:
            pcm = FramedPcm(start.rate, start.width, start.channels)
        except ValueError as e:
            raise Rejected("unsupported_audio", f"unsupported audio: {e}") from e
        host, services = self.services.live, self.services
        deps = LiveDeps(services.settings, host, host.admit(), services.diarizer, services.voices)
        endpoint = self.sensitivity if self._endpointing else None
        try:
            model = self._model(deps.models, self.model_name)
            options, job = wyoming_options(model, self.language, deps.defaults, endpoint)
        except Rejected:
            deps.admission.close()
            raise
        runner = host.start(
            model, options, pcm, lambda e: self._on_event(runner, e), hear_at_once=True
        )
        utterance = Utterance(runner, model, host.pool, job, FINAL_PASS_MAX_S)
        self.current = _InFlight(deps, pcm, utterance, endpoint is not None)
        if self.speakers is None and deps.settings.wyoming_speakers and deps.diarizer is not None:
            self.speakers = SessionSpeakers(live_speakers(deps), self._error)
        self.outbox.put(TranscriptStart(language=job.options.language or None).event())

    def _chunk(self, chunk: AudioChunk) -> None:
        current = self.current
        if current is None:
            raise Rejected("no_audio_start", "audio-chunk before audio-start")
        if current.answer is not None:
            return  # past the end of the command, which was answered
        pcm = current.pcm
        announced = (pcm.sample_rate, pcm.width, pcm.channels)
        if (chunk.rate, chunk.width, chunk.channels) != announced:
            raise Rejected(
                "audio_format_changed", f"audio-chunk is {chunk.rate} Hz x {chunk.width} byte(s)"
                f" x {chunk.channels} channel(s), audio-start announced {announced[0]} Hz x "
                f"{announced[1]} x {announced[2]}: chunk dropped",
            )  # fmt: skip
        try:
            current.utterance.add(chunk.audio)
        except AudioDecodeError as e:
            raise Rejected("invalid_audio", f"audio dropped: {e}") from e

    async def _stop(self) -> None:
        current = self.current
        if current is None:
            raise Rejected("no_audio_start", "audio-stop before audio-start")
        if current.answer is None:  # else its end of turn answered it (or is answering)
            current.answer = asyncio.ensure_future(self._answer(current))
        await self._end_utterance()  # raises what the answer raised (`Rejected`: to the client)

    async def _answer(self, current: _InFlight) -> None:
        """The command ended (its end of turn, or audio-stop): transcript, transcript-stop."""
        audio = current.utterance.recording() if self.speakers is not None else None
        who = None if audio is None else asyncio.ensure_future(self.speakers.speaker(audio))
        text, language = await current.utterance.finish()
        speaker = None if who is None else await who
        context = {"speaker": speaker} if speaker else None
        await self.outbox.wait_sent(self._sender)  # every transcript-chunk before the transcript
        self.outbox.put(Transcript(text=text, language=language, context=context).event())
        self.outbox.put(TranscriptStop().event())

    async def _answer_at_end(self, current: _InFlight) -> None:
        """`_answer` at the end of the turn, while audio may still arrive."""
        try:
            await self._answer(current)
        except Rejected as e:
            self._error(e)

    async def _end_utterance(self) -> None:
        """The utterance is over: its answer (if under way) sent, its session ended. It stays
        the current one while it answers: the session's events (its VAD hearing speech go on)
        still reach it."""
        current = self.current
        if current is None:
            return
        try:
            if current.answer is not None:
                await current.answer
        finally:
            if self.current is current:
                self.current = None
            await current.end()

    # ---- output ---------------------------------------------------------------------------
    def _on_event(self, runner: LiveRunner, event: StreamEvent) -> None:
        """A live session's event: committed words go out as transcript chunks; what its VAD
        hears goes to the utterance (its early pass)."""
        current = self.current
        if current is None or current.utterance.runner is not runner:  # an ended one
            return
        if isinstance(event, VoiceActivity):
            current.utterance.voice(event)
        elif isinstance(event, CommittedText) and event.text.strip():
            current.worded = True
            self.outbox.put(TranscriptChunk(text=event.text).event())
        elif (
            isinstance(event, Finalized)
            and event.reason == "pause"
            and current.endpoint
            and current.worded
            and current.answer is None
        ):  # the turn that said words ended: the command is over
            log.info("wyoming: the command ended at %.2f s", event.at)
            current.answer = asyncio.ensure_future(self._answer_at_end(current))

    async def _send(self) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):  # the client left
            while True:
                event = await self.outbox.get()
                await async_write_event(event, self.writer)
                self.outbox.sent()

    def _error(self, error: Rejected) -> None:
        log.info("wyoming: %s (%s)", error.message, error.code)
        self.outbox.put(Error(text=error.message, code=error.code).event())
