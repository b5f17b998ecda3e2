"""Warm worker process for our engine (run by the benchmarks with .venv's Python; not for people).

Reads JSON lines on stdin, answers one JSON line per request on stdout:
  {"op": "load", "model_dir", "ep", "precision", "threads", "kv_cache", "activation_quantization"}
    -> {"load_s", "rss_mb"}
  {"op": "transcribe", "path", "beam_size", "language"?, "kv_cache"?, "temperature"?,
   "vad_filter"?, "no_speech_threshold"?, "repetition_guard"?, "seed"?,
   "word_timestamps"?}
      -> {"text", "total_s", "audio_decode_s", "stats": TranscriptionStats.as_dict(), ...}
  {"op": "rss"} -> {"rss_mb", "peak_rss_mb"};  {"op": "quit"}
End-to-end time = decode the file + transcribe + consume every segment, as `python -m app
transcribe` does after loading.
"""

from __future__ import annotations

import time
from pathlib import Path

from app.engine.audio import decode_audio
from app.engine.tokenizer import Tokenizer
from app.engine.vad import VAD_FILE, SileroVad
from app.runtime.blas import quiet_blas
from app.runtime.memory import tune_malloc
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from benchmarks.worker_protocol import rss, serve


class Engine:
    def __init__(self) -> None:
        self.transcriber: Transcriber | None = None
        self.kv_cache = "concat"

    def load(
        self,
        model_dir: str,
        ep: str,
        precision: str | None,
        threads: int,
        kv_cache: str = "concat",
        activation_quantization: str = "auto",
    ) -> dict:
        started = time.perf_counter()
        folder = Path(model_dir)
        sessions = WhisperSessions.load(
            folder,
            RuntimeOptions(
                ep=ep,
                threads=threads,
                inference_precision=precision,
                activation_quantization=activation_quantization,
            ),
        )
        tokenizer = Tokenizer.from_folder(folder, sessions.manifest)
        vad_path = folder.parent / VAD_FILE
        vad = SileroVad.load(vad_path) if vad_path.is_file() else None
        self.transcriber = Transcriber(sessions, tokenizer, vad=vad)
        self.kv_cache = kv_cache
        return {"load_s": time.perf_counter() - started, "devices": sessions.devices, **rss()}

    def transcribe(
        self,
        path: str,
        beam_size: int,
        language: str | None = "en",
        kv_cache: str | None = None,
        temperature: float | None = None,
        vad_filter: bool = False,
        no_speech_threshold: float | None = 0.6,
        repetition_guard: bool = True,
        seed: int | None = 0,
        word_timestamps: bool = False,
    ) -> dict:
        assert self.transcriber is not None
        extra = {} if temperature is None else {"temperature": (temperature,)}
        options = TranscriptionOptions(
            language=language,
            beam_size=beam_size,
            kv_cache=kv_cache or self.kv_cache,
            vad_filter=vad_filter,
            no_speech_threshold=no_speech_threshold,
            repetition_guard=repetition_guard,
            seed=seed,
            word_timestamps=word_timestamps,
            **extra,
        )
        t0 = time.perf_counter()
        audio = decode_audio(Path(path))
        t1 = time.perf_counter()
        segments, info = self.transcriber.transcribe(audio, options)
        segments = list(segments)
        total = time.perf_counter() - t0
        return {
            "text": "".join(s.text for s in segments).strip(),
            "total_s": total,
            "audio_decode_s": t1 - t0,
            "audio_s": audio.shape[0] / 16000,
            "segments": len(segments),
            "tokens": sum(len(s.tokens) for s in segments),
            "stats": info.stats.as_dict(),
            "words": [[w.word, w.start, w.end] for s in segments for w in (s.words or ())],
        }


def main() -> None:
    tune_malloc()  # the process settings `python -m app transcribe` makes
    quiet_blas()
    engine = Engine()
    serve({"load": engine.load, "transcribe": engine.transcribe})


if __name__ == "__main__":
    main()
