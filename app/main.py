"""The app factory: `uvicorn --factory app.main:create_app`.

Start-up checks that every model of STT_MODELS is built or can be built, then builds (from weights
on disk, or fetched if STT_MODEL_DOWNLOADS), loads and warms them on a background thread:
`/health` answers 503 until they are ready, then 200 with models, devices and memory. A missing or
broken model is logged as an error and keeps `/health` at 503 with the reason (the server stays
up: exiting would only have a supervisor restart it into the same error). Later models load and
unload at run time (`app.service.models.manager`); this module injects the exporter's model names
and `obtain_model` into it.
Shutdown (SIGTERM): live WebSocket sessions end first, properly (final pass, transcript.text.done,
close 1001); then uvicorn lets the requests in flight finish (up to its
`--timeout-graceful-shutdown`), and the lifespan waits for the jobs still running to stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from app.api import docs as docs_api
from app.api.errors import install_error_handlers
from app.api.limits import UploadLimitMiddleware
from app.api.live import audio_stream, client_secrets, page, realtime
from app.api.live.wyoming import WyomingServer
from app.api.metrics import Metrics, RequestMetricsMiddleware
from app.api.routes import audio, health, metrics, models, voices
from app.api.services import Services
from app.config import Settings
from app.export import names
from app.export.child import ChildBuildError, obtain_in_child
from app.export.errors import BuildError
from app.export.vad import ensure_sequence_graphs
from app.runtime.blas import quiet_blas
from app.runtime.graphs import compile_counts
from app.runtime.memory import release_free_memory, tune_malloc
from app.runtime.placement import RuntimeOptions
from app.runtime.static_shapes import batch_rows
from app.service.batching.records import BatchingOptions
from app.service.diarize.job import LazyDiarizer
from app.service.gate import ServerGate
from app.service.live import LiveHost, LiveLimits
from app.service.models.manager import ModelManager
from app.service.models.opening import ModelLoadError, OpenOptions
from app.service.models.options import ManagerOptions, ModelNames, Obtain
from app.service.pool import WorkerPool
from app.service.transcription.transcriber import TranscriptionOptions
from app.service.voices.registry import VoiceRegistry
from app.service.voices.store import FILE_NAME, VoiceStore

log = logging.getLogger(__name__)

# names OpenAI clients send by default (REST, Realtime) -> the default model
OPENAI_MODEL_ALIASES = (
    "whisper-1",
    "gpt-4o-transcribe",
    "gpt-4o-mini-transcribe",
    "gpt-4o-mini-transcribe-2025-12-15",
    "gpt-transcribe",
    "gpt-live-transcribe",
    "gpt-realtime-whisper",
    "gpt-4o-transcribe-diarize",  # with speakers (REST: app.api.speaker_form; Realtime)
)
UPLOAD_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")
SHUTDOWN_DRAIN_S = 30.0  # most time shutdown waits for running (already cancelled) jobs
STREAM_DRAIN_S = 30.0  # most time a signal waits for live sessions to end before shutdown
# the free heap goes back to the system once no job has come for this long: requests that follow
# each other keep the warm heap (trimmed after each, the next one page-faulted its buffers back:
# ~3 % of a 60 s request, benchmarks/results/genai_cpu.md), an idle server its small footprint
HEAP_IDLE_S = 5.0


def configure_logging(level: str) -> None:
    """Log `app.*` at `level` to stderr (uvicorn configures its own loggers)."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    logging.getLogger("app").setLevel(level)


def runtime_options(settings: Settings) -> RuntimeOptions:
    """Where and how the Whisper models run."""
    return RuntimeOptions(
        ep=settings.ep,
        device=settings.device,
        encoder_device=settings.encoder_device,
        decoder_device=settings.decoder_device,
        threads=settings.threads,
        cache_dir=settings.ov_cache_dir,
        inference_precision=settings.precision,
        activation_quantization=settings.activation_quantization,
        npu_emulation=settings.npu_emulation,
        static_batch_rows=batch_rows(settings.batch_max_rows) if settings.batching else (),
    )


def speaker_runtime(settings: Settings) -> RuntimeOptions:
    """Where the speaker models run: the Whisper models' options on DIARIZATION_DEVICE."""
    return replace(runtime_options(settings), device=settings.resolved_diarization_device)


def build_models(settings: Settings) -> ModelManager:
    """The model manager for these settings (nothing is loaded yet)."""
    runtime = runtime_options(settings)
    default = settings.resolved_default_model
    aliases = {a: default for a in OPENAI_MODEL_ALIASES if a not in settings.models}
    batching = None
    if settings.batching:
        batching = BatchingOptions(
            max_rows=settings.batch_max_rows,
            max_padding=settings.batch_max_padding,
            max_encode=settings.batch_max_encode,
            encoder_share=settings.batch_encoder_share,
        )
    base_options = TranscriptionOptions(
        kv_cache=settings.kv_cache,
        vad_filter=settings.vad_filter,
        no_speech_threshold=settings.no_speech_threshold,
        repetition_guard=settings.repetition_guard,
    )
    return ModelManager(
        models_dir=settings.models_dir,
        default_model=default,
        open_options=OpenOptions(runtime=runtime, base_options=base_options, batching=batching),
        options=ManagerOptions(
            ttl_s=settings.model_ttl_s,
            max_loaded=settings.max_loaded_models,
            autoload=settings.model_autoload,
            downloads=settings.model_downloads,
        ),
        names=ModelNames(
            known={k: v for k, v in names.known_models().items() if names.canonical_id(k) == k},
            model_id=names.model_id,
            fetchable=_fetchable,
            canonical=names.canonical_id,
        ),
        obtain=_obtainer(settings.models_dir, settings.weights_cache_dir),
        aliases=aliases,
    )


def _fetchable(model_id: str) -> bool:
    """A catalog name, an alias or a well-formed Hub repository id."""
    try:
        names.resolve_name(model_id)
    except BuildError:
        return False
    return True


def _obtainer(models_dir: Path, cache_dir: Path) -> Obtain:
    """`obtain_model` in a child process (app/export/child.py: the build's memory goes back to
    the system with it, and a crash takes only the child), its errors as `ModelLoadError`."""

    def obtain(model_id: str, allow_download: bool, on_progress: Callable[[float], None]) -> Path:
        try:
            return obtain_in_child(
                model_id, models_dir, cache_dir,
                allow_download=allow_download, on_progress=on_progress,
            )  # fmt: skip
        except ChildBuildError as e:
            how = "" if allow_download else " (STT_MODEL_DOWNLOADS is off: no new weights)"
            raise ModelLoadError(f"could not build model '{model_id}'{how}: {e}") from e

    return obtain


def _load_models(models: ModelManager, settings: Settings, gate: ServerGate) -> None:
    """Loader thread body: build/load + warm every start-up model, then open the gate."""
    t0 = time.perf_counter()
    _vad_sequence_graphs(settings.models_dir)
    try:
        models.start(settings.models)
    except Exception as e:
        message = str(e) if isinstance(e, ModelLoadError) else f"{type(e).__name__}: {e}"
        log.error("model loading failed, the server cannot transcribe: %s", message, exc_info=e)
        gate.loaded(message)
        return
    log.info("ready: %s in %.2f s", ", ".join(models.loaded), time.perf_counter() - t0)
    gate.loaded()


def _vad_sequence_graphs(models_dir: Path) -> None:
    """A models folder made before the VAD's sequence graphs were built at `make models` gets
    them now (milliseconds; without them the VAD would not load)."""
    try:
        for path in ensure_sequence_graphs(models_dir):
            log.info("VAD: wrote %s", path.name)
    except (BuildError, OSError) as e:
        log.warning("VAD: could not write its sequence graphs: %s", e)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    services: Services = app.state.services
    models, gate, settings = services.models, services.gate, services.settings
    try:
        models.catalog.check(settings.models)
    except ModelLoadError as e:
        # Stay up and say why on /health (503): exiting would only make a supervisor restart
        # the server into the same error, again and again.
        log.error("cannot load the models, the server cannot transcribe: %s", e)
        gate.loaded(str(e))
    else:
        loader = threading.Thread(
            target=_load_models,
            args=(models, settings, gate),
            name="stt-loader",
            daemon=True,
        )
        loader.start()
    _end_live_sessions_first(services)
    wyoming = WyomingServer(services) if settings.wyoming_port else None
    if wyoming is not None:
        await wyoming.start()  # a port in use fails the start, with the reason
    try:
        yield
    finally:
        if wyoming is not None:
            await wyoming.stop()
        await _drain(services.pool, SHUTDOWN_DRAIN_S)
        models.close()


def _end_live_sessions_first(services: Services) -> None:
    """Under uvicorn, make SIGTERM / SIGINT shut the server down in order:

    1. /health answers 503 (draining) at once, and for `STT_SHUTDOWN_DELAY_S` the server keeps
       serving as before, so a load balancer's health check takes it out of rotation before it
       stops accepting connections (nothing sent meanwhile fails);
    2. every live WebSocket session ends properly (a final pass over the audio received, its
       final event, close 1001), for at most STREAM_DRAIN_S; new sessions are refused;
    3. the signal goes to uvicorn, which closes the rest of the server as usual (requests in
       flight finish within --timeout-graceful-shutdown). Without step 2 uvicorn closes live
       sessions with 1012 at once and their last words are lost.
    A second signal skips what is left of the waits.
    """
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers belong to the main thread (not an app run under uvicorn)
    loop = asyncio.get_running_loop()
    hurry = asyncio.Event()  # a second signal
    gate = services.gate
    for sig in (signal.SIGTERM, signal.SIGINT):
        uvicorn_exit = signal.getsignal(sig)
        if getattr(uvicorn_exit, "__name__", "") != "handle_exit":
            continue  # not uvicorn's handler: leave the signal alone

        def on_signal(signum: int, frame: object, uvicorn_exit=uvicorn_exit) -> None:
            if not gate.drain():  # a second signal
                loop.call_soon_threadsafe(hurry.set)
                uvicorn_exit(signum, frame)
                return
            loop.call_soon_threadsafe(
                lambda: loop.create_task(_shut_down_in_order(services, uvicorn_exit, signum, hurry))
            )

        signal.signal(sig, on_signal)


async def _shut_down_in_order(
    services: Services, uvicorn_exit: Callable, signum: int, hurry: asyncio.Event
) -> None:
    delay = services.settings.shutdown_delay_s
    if delay:
        log.info("shutdown: draining (/health 503), serving for %.1f s more", delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(hurry.wait(), delay)
    sessions = services.live
    if sessions.count and not hurry.is_set():
        log.info("shutdown: ending %d live session(s) first", sessions.count)
        sessions.drain.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sessions.none(), STREAM_DRAIN_S)
    services.gate.stop()
    sessions.drain.set()
    uvicorn_exit(signum, None)


async def _drain(pool: WorkerPool, timeout_s: float) -> None:
    """At shutdown: refuse new jobs and drop waiting ones, then wait (at most `timeout_s`) for
    the running ones to end before the models close.

    uvicorn has already let the requests in flight finish (up to `--timeout-graceful-shutdown`)
    or cancelled them; a cancelled job stops at its next decoder step.
    """
    stats = pool.stats()
    pool.shutdown(wait=False)
    if stats.active:
        log.info("shutdown: waiting for %d running job(s)", stats.active)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(pool.drained(), timeout_s)
    if pool.active:
        log.warning("shutdown: %d job(s) still running after %.0f s", pool.active, timeout_s)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the FastAPI app; heavy work (model loading) happens in the lifespan."""
    settings = settings or Settings()
    configure_logging(settings.log_level)
    tune_malloc()
    quiet_blas()

    app = FastAPI(
        title="stt-openvino",
        summary="Whisper speech-to-text, OpenAI-compatible, on OpenVINO",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # /docs and /openapi.json come from app.api.docs, behind the API key
        redoc_url=None,
        openapi_url=None,
    )
    collector = Metrics()
    pool = WorkerPool(
        settings.worker_count,
        settings.max_queue,
        threads=settings.thread_count,
        on_idle=release_free_memory,
        idle_delay_s=HEAP_IDLE_S,
    )
    collector.bind_pool(pool)
    collector.bind_compiles(compile_counts)
    manager, gate = build_models(settings), ServerGate()
    limits = LiveLimits(settings.stream_max_session_s, settings.stream_max_buffered_s)
    live = LiveHost(manager, pool, gate, limits, settings.stream_max_sessions)
    diarizer = LazyDiarizer(settings.models_dir, speaker_runtime(settings))  # first use loads
    store = VoiceStore(settings.data_dir / FILE_NAME)  # opened by the first registry call
    registry = VoiceRegistry(store, diarizer, settings.models_dir)
    services = Services(settings, manager, pool, collector, gate, live, diarizer, registry)
    services.models.add_listener(collector.model_changed)
    app.state.services = services  # the routes get it through app.api.deps

    install_error_handlers(app)
    app.add_middleware(
        UploadLimitMiddleware, limit_bytes=settings.max_upload_bytes, paths=UPLOAD_PATHS
    )
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type"],
        )
    app.add_middleware(RequestMetricsMiddleware, metrics=collector)

    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(audio.router)
    app.include_router(metrics.router)
    app.include_router(voices.router)
    app.include_router(audio_stream.router)  # WebSocket /v1/audio/stream
    app.include_router(realtime.router)  # WebSocket /v1/realtime (OpenAI Realtime)
    app.include_router(client_secrets.router)  # its short-lived keys
    app.include_router(page.router)  # the page at /
    app.include_router(docs_api.router)  # /openapi.json, /docs
    log.info(
        "app created: models %s (default %s) from %s, %s/%s, %d worker(s), queue %d",
        ",".join(settings.models),
        settings.resolved_default_model,
        settings.models_dir,
        settings.ep,
        settings.device,
        settings.worker_count,
        settings.max_queue,
    )
    return app
