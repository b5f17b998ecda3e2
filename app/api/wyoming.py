"""Home Assistant's Wyoming protocol: speech-to-text over TCP on the same models, scheduler and
limits as the HTTP API (`STT_WYOMING_PORT`; off when empty).

One connection at a time per client, events framed by the `wyoming` package:

    describe                      -> info (an `asr` program: the models, their languages)
    transcribe {name, language}   -> (model and language of the next utterance; optional)
    audio-start {rate, width, channels}
                                  -> transcript-start {language}
    audio-chunk ... (PCM)         -> transcript-chunk {text} as words are committed, while the
                                     person speaks (the live-session core the WebSocket uses)
    audio-stop                    -> transcript {text, language}, transcript-stop

The `transcript` is the whole utterance transcribed as an uploaded file is (greedy, the server's
defences), on the shared worker pool, started as soon as the speaker pauses
(`app/service/live/utterance.py`): the chunks come early from the live session and may differ
from it by a word; the transcript is the text to act on. An utterance longer than
`FINAL_PASS_MAX_S` keeps the live session's text instead (its audio is not held).

Audio in any rate (8-192 kHz), sample width (1, 2 or 4 bytes) and channel count (averaged) the
`audio-start` announces. Bad input gets an `error` event {text, code}: an unknown event, a chunk
before `audio-start` or in another format than announced, an unsupported format, an unknown
model or language; the connection goes on. A header or chunk larger than the limits
(`STT_STREAM_MAX_FRAME_KB`), a client silent for `STT_STREAM_IDLE_TIMEOUT_S`, a session limit, or
more than `STT_WYOMING_MAX_CLIENTS` connections: an `error` event, then the connection closes.

Trust model: like Home Assistant's own Wyoming servers there is no authentication (the protocol
has none): bind it to a LAN or a host-only address you trust (`STT_WYOMING_HOST`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event, async_write_event
from wyoming.info import AsrModel, AsrProgram, Attribution, Describe, Info
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncTcpServer

from app.api.discovery import WyomingAnnouncement
from app.api.live.connection import LiveDeps
from app.api.live.stream_options import wyoming_options
from app.api.services import Readiness, Services
from app.api.wyoming_framing import BoundedReader, WyomingError, close_gently
from app.service.errors import Rejected
from app.service.live import (
    AudioDecodeError,
    CommittedText,
    FramedPcm,
    LimitExceeded,
    LiveRunner,
    StreamEvent,
)
from app.service.live.pacing import RealTimeFeed
from app.service.live.utterance import Utterance, UtteranceFormat
from app.service.model_leases import SessionModels
from app.service.options import model_language, model_languages
from app.service.pool import PoolClosedError, QueueFullError
from app.service.registry import LoadedModel

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
        services = self.services
        models = SessionModels(services.models)  # leases what the connection uses until it ends
        deps = LiveDeps(self.settings, models, services.pool, models.vad, services.live.drain)
        return SttHandler(reader, writer, self, deps, services.readiness)


class SttHandler:
    """One Wyoming connection: reads events, runs one utterance at a time on a `LiveRunner`."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        server: WyomingServer,
        deps: LiveDeps,
        readiness: Readiness,
    ) -> None:
        settings = deps.settings
        self.reader = BoundedReader(reader, settings.stream_max_frame_kb * 1024)
        self.writer = writer
        self.server = server
        self.deps = deps
        self.readiness = readiness
        self.idle_timeout = settings.stream_idle_timeout_s
        self.model_name: str | None = None  # None = the default model
        self.language: str | None = None
        self.runner: LiveRunner | None = None
        self.pcm: FramedPcm | None = None  # the format audio-start announced
        self.utterance: Utterance | None = None  # its audio and whole-utterance transcription
        self.feed: RealTimeFeed | None = None  # the audio to the live session and the utterance's
        # pause detector, at real-time pace
        self._write_lock = asyncio.Lock()
        self._chunks: asyncio.Queue[str] = asyncio.Queue()
        self._sender: asyncio.Task[None] | None = None

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
                await self._error(
                    WyomingError(f"the server serves at most {limit} Wyoming clients", "busy")
                )
                return
            await self._serve()
        except Exception:
            log.exception("wyoming: the connection failed")
        finally:
            server.clients -= 1
            await self._end_utterance()
            await close_gently(self.reader.reader, self.writer)
            self.deps.registry.close()

    async def _serve(self) -> None:
        while True:
            try:
                event = await asyncio.wait_for(
                    async_read_event(self.reader),  # type: ignore[arg-type]
                    self.idle_timeout,
                )
            except TimeoutError:
                await self._error(WyomingError(
                    f"no event for {self.idle_timeout:g} s", "idle_timeout", close=True
                ))  # fmt: skip
                return
            except WyomingError as e:
                await self._error(e)
                return
            except (ConnectionError, asyncio.IncompleteReadError):
                return
            if event is None:  # the client closed, or sent a line that is not JSON
                return
            try:
                await self._handle(event)
            except WyomingError as e:
                await self._error(e)
                if e.close:
                    return
            except (ConnectionError, RuntimeError):  # the client left while we answered
                return

    # ---- events -------------------------------------------------------------------------
    async def _handle(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self._write(self._info().event())
        elif Ping.is_type(event.type):
            await self._write(Pong(text=Ping.from_event(event).text).event())
        elif Transcribe.is_type(event.type):
            request = Transcribe.from_event(event)
            model = self._model(request.name)
            self._language(model, request.language)  # checked now, used at audio-start
            self.model_name, self.language = request.name, request.language
        elif AudioStart.is_type(event.type):
            await self._start(AudioStart.from_event(event))
        elif AudioChunk.is_type(event.type):
            self._chunk(AudioChunk.from_event(event))
        elif AudioStop.is_type(event.type):
            await self._stop()
        else:
            raise WyomingError(f"unknown event type {event.type!r}", "unknown_event")

    def _info(self) -> Info:
        registry = self.deps.registry
        models = []
        for name in self.deps.settings.models:
            info = registry.info(name)
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
        )
        return Info(asr=[program])

    def _model(self, name: str | None) -> LoadedModel:
        if not self.readiness.ready:
            raise WyomingError(
                self.readiness.error or "the models are still loading; retry shortly", "loading"
            )
        try:
            return self.deps.registry.get(name or None)
        except Rejected as e:
            raise WyomingError(e.message, e.code) from e

    def _language(self, model: LoadedModel, language: str | None) -> str | None:
        try:
            return model_language(model.name, model.multilingual, language)
        except Rejected as e:
            raise WyomingError(e.message, e.code) from e

    async def _start(self, start: AudioStart) -> None:
        await self._end_utterance()
        if self.deps.drain.is_set() or self.readiness.draining:
            raise WyomingError("the server is shutting down", "shutting_down", close=True)
        model = self._model(self.model_name)
        try:
            options, job = wyoming_options(model, self.language, self.deps.defaults)
        except Rejected as e:
            raise WyomingError(e.message, e.code) from e
        language = options.language
        try:
            pcm = FramedPcm(start.rate, start.width, start.channels)
        except ValueError as e:
            raise WyomingError(f"unsupported audio: {e}", "unsupported_audio") from e
        self.pcm = pcm
        fmt = UtteranceFormat(start.rate, start.width, start.channels)
        utterance = Utterance(model, self.deps.pool, self.deps.vad, fmt, job, FINAL_PASS_MAX_S)
        runner = LiveRunner(model.transcriber, options, self.deps.vad, pcm,
                            self.deps.pool, self.deps.limits, self._on_event)  # fmt: skip
        runner.start()

        def hear(data: bytes) -> None:  # the audio as it is spoken
            runner.append(data)
            utterance.heard(data)

        self.utterance, self.runner = utterance, runner
        self.feed = RealTimeFeed(hear, fmt.bytes_per_s)
        self._sender = asyncio.create_task(self._send_chunks())
        await self._write(TranscriptStart(language=language or None).event())

    def _chunk(self, chunk: AudioChunk) -> None:
        pcm, runner = self.pcm, self.runner
        if pcm is None or runner is None:
            raise WyomingError("audio-chunk before audio-start", "no_audio_start")
        announced = (pcm.sample_rate, pcm.width, pcm.channels)
        if (chunk.rate, chunk.width, chunk.channels) != announced:
            raise WyomingError(
                f"audio-chunk is {chunk.rate} Hz x {chunk.width} byte(s) x {chunk.channels} "
                f"channel(s), audio-start announced {announced[0]} Hz x {announced[1]} x "
                f"{announced[2]}: chunk dropped", "audio_format_changed",
            )  # fmt: skip
        try:
            pcm.check_frames(chunk.audio)  # now, not when the feed hands the chunk on
        except AudioDecodeError as e:
            raise WyomingError(f"audio dropped: {e}", "invalid_audio") from e
        assert self.feed is not None
        self._check_feed()
        self.feed.put(chunk.audio)
        if self.utterance is not None:
            self.utterance.add(chunk.audio)

    def _check_feed(self) -> None:
        assert self.feed is not None
        try:
            self.feed.check()
        except AudioDecodeError as e:
            raise WyomingError(f"audio dropped: {e}", "invalid_audio") from e
        except LimitExceeded as e:
            raise WyomingError(str(e), e.code, close=True) from e

    async def _stop(self) -> None:
        runner, utterance, feed = self.runner, self.utterance, self.feed
        if runner is None or utterance is None or feed is None:
            raise WyomingError("audio-stop before audio-start", "no_audio_start")
        language = utterance.job.options.language
        try:
            if utterance.recorded is None:  # too long to hold: the live text
                feed.flush()
                text = (await runner.close()).strip()
            else:
                await feed.stop()
                await runner.stop()  # the whole-utterance pass covers everything
                result = await utterance.transcript()
                assert result is not None
                text, language = result.text, result.language
        except LimitExceeded as e:
            raise WyomingError(str(e), e.code, close=True) from e
        except PoolClosedError as e:
            raise WyomingError("the server is shutting down", "shutting_down", close=True) from e
        except QueueFullError as e:
            raise WyomingError(f"the server is busy, retry shortly ({e})", "busy") from e
        await self._chunks.join()  # every transcript-chunk is out before the transcript
        await self._write(Transcript(text=text, language=language).event())
        await self._write(TranscriptStop().event())
        await self._end_utterance()

    # ---- output ---------------------------------------------------------------------------
    def _on_event(self, event: StreamEvent) -> None:
        if isinstance(event, CommittedText) and event.text.strip():
            self._chunks.put_nowait(event.text)

    async def _send_chunks(self) -> None:
        while True:
            text = await self._chunks.get()
            try:
                await self._write(TranscriptChunk(text=text).event())
            finally:
                self._chunks.task_done()

    async def _write(self, event: Event) -> None:
        async with self._write_lock:
            await async_write_event(event, self.writer)

    async def _error(self, error: WyomingError) -> None:
        log.info("wyoming: %s (%s)", error, error.code)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._write(Error(text=str(error), code=error.code).event())

    async def _end_utterance(self) -> None:
        runner, sender, utterance, feed = self.runner, self._sender, self.utterance, self.feed
        self.runner, self._sender, self.pcm = None, None, None
        self.utterance, self.feed = None, None
        if feed is not None:
            await feed.stop()
        if utterance is not None:
            utterance.close()
        if runner is not None:
            await runner.stop()
        if sender is not None:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
        self._chunks = asyncio.Queue()
