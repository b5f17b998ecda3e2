"""Opening one built model folder: sessions, tokenizer, the batching scheduler, warm-up, and the
memory it took. Also the Silero VAD every model shares. Blocking: run on a loader thread."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.backend import WhisperBackend
from app.engine.tokenizer import Tokenizer
from app.engine.turn import TURN_FILE, TurnModel, TurnModelError
from app.engine.vad import VAD_FILE, SileroVad, VadModelError
from app.runtime.contract import missing_files
from app.runtime.memory import release_free_memory
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.batching.records import BatchingOptions
from app.service.batching.scheduler import BatchingSessions
from app.service.models.loaded import LoadedModel
from app.service.transcription.transcriber import TranscriptionOptions

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    """A model could not be found, built, loaded or warmed up; the message says why."""


@dataclass(frozen=True)
class OpenOptions:
    """How every model is opened."""

    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)
    base_options: TranscriptionOptions = field(default_factory=TranscriptionOptions)
    batching: BatchingOptions | None = None  # batch concurrent jobs' model calls (None = off)
    warm_up: bool = True


def rss_bytes() -> int:
    """This process's resident set size now (0 where /proc is missing)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def list_model_folders(models_dir: Path) -> dict[str, Path]:
    """Folder name -> folder for every complete model folder (all contract files present)."""
    if not models_dir.is_dir():
        return {}
    return {p.name: p for p in sorted(models_dir.iterdir()) if p.is_dir() and not missing_files(p)}


def load_vad(models_dir: Path) -> SileroVad | None:
    """The Silero VAD model beside the models, shared by all; None (logged) if absent."""
    try:
        return SileroVad.load(models_dir / VAD_FILE)
    except VadModelError as e:
        log.warning(
            "no VAD: transcribing without it; vad_filter=true requests will be refused: %s", e
        )
        return None


def load_turn_model(models_dir: Path) -> TurnModel | None:
    """The Smart Turn model beside the models, shared by all live sessions; None (logged) if
    absent (Realtime `semantic_vad` is then refused)."""
    try:
        return TurnModel.load(models_dir / TURN_FILE)
    except TurnModelError as e:
        log.warning("no turn model: semantic_vad will be refused: %s", e)
        return None


def open_model(name: str, folder: Path, options: OpenOptions, vad: SileroVad | None) -> LoadedModel:
    """Load (and warm up) the model in `folder`; raises `ModelLoadError` with the cause.

    `LoadedModel.memory_bytes` is the growth of this process's RSS across the load and warm-up:
    the model's own memory when it loads alone (loads running at the same time share it out
    unevenly).
    """
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    try:
        loaded = WhisperSessions.load(folder, options.runtime)
        tokenizer = Tokenizer.from_folder(folder, loaded.manifest)
    except Exception as e:
        raise ModelLoadError(f"could not load model '{name}' from {folder}: {e}") from e
    sessions: WhisperBackend = loaded
    # the static cache asked for on a CPU keeps the decoder at one shape: no batch of varying
    # size; a static device (NPU) batches on the row counts it compiled for batched steps
    if loaded.static:
        fixed = not options.runtime.static_batch_rows
    else:
        fixed = options.base_options.kv_cache == "static"
    if options.batching is not None and not fixed:
        sessions = BatchingSessions(loaded, options.batching, name=name)
    load_s = time.perf_counter() - t0
    created = int((folder / "manifest.json").stat().st_mtime)
    model = LoadedModel(name, sessions, tokenizer, options.base_options, load_s, created, vad=vad)
    if options.warm_up:
        try:
            model.warm_up()
        except Exception as e:
            model.close()
            raise ModelLoadError(f"warm-up of model '{name}' failed: {e}") from e
    release_free_memory()  # what loading and the warm-up freed, before RSS is read
    model.memory_bytes = max(0, rss_bytes() - rss0)
    info = model.info
    log.info(
        "model %s loaded in %.2f s, warmed up in %.2f s; devices %s; arithmetic %s; RSS +%.0f MB",
        name,
        info.load_s,
        info.warmup_s,
        info.devices,
        info.arithmetic,
        model.memory_bytes / 2**20,
    )
    return model
