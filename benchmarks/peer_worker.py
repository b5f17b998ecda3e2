"""Warm worker process for the peer, faster-whisper (run with .venv-peer's Python; see
`make bench-setup`). Imports nothing from the project but the standard-library-only
`benchmarks/worker_protocol.py`: its venv has plain onnxruntime.

Reads JSON lines on stdin, answers one JSON line per request on stdout:
  {"op": "load", "model_dir", "compute_type", "threads"} -> {"load_s", "rss_mb"}
  {"op": "transcribe", "path", "beam_size", "language"?, "temperature"?, "vad_filter"?, "seed"?,
   "word_timestamps"?}
      -> {"text", "total_s", "tokens", ...}
  {"op": "stages", "path"} -> decode audio, log-mel and one 30 s encoder window, timed apart
  {"op": "rss"};  {"op": "quit"}
End-to-end time = WhisperModel.transcribe(path) + consuming every segment (it decodes the file).
"""

from __future__ import annotations

import time

from benchmarks.worker_protocol import rss, serve


class Peer:
    def __init__(self) -> None:
        self.model = None

    def load(self, model_dir: str, compute_type: str, threads: int) -> dict:
        started = time.perf_counter()
        from faster_whisper import WhisperModel

        self.model = WhisperModel(
            model_dir, device="cpu", compute_type=compute_type, cpu_threads=threads, num_workers=1
        )
        return {"load_s": time.perf_counter() - started, **rss()}

    def transcribe(
        self,
        path: str,
        beam_size: int,
        language: str | None = "en",
        temperature: float | None = None,
        vad_filter: bool = False,
        seed: int | None = None,
        word_timestamps: bool = False,
        **_: object,
    ) -> dict:
        if seed is not None:
            import ctranslate2

            ctranslate2.set_random_seed(seed)  # the fallback's sampling
        extra = {} if temperature is None else {"temperature": temperature}
        extra["vad_filter"] = vad_filter
        extra["word_timestamps"] = word_timestamps
        t0 = time.perf_counter()
        segments, info = self.model.transcribe(
            path, language=language, beam_size=beam_size, **extra
        )
        segments = list(segments)
        total = time.perf_counter() - t0
        return {
            "text": "".join(s.text for s in segments).strip(),
            "total_s": total,
            "audio_s": info.duration,
            "segments": len(segments),
            "tokens": sum(len(s.tokens) for s in segments),
            "temperatures": sorted({s.temperature for s in segments}),
            "words": [[w.word, w.start, w.end] for s in segments for w in (s.words or ())],
        }

    def stages(self, path: str, repeats: int = 3) -> dict:
        """Front-end stages timed on their own (medians): not visible inside transcribe()."""
        import statistics

        from faster_whisper.audio import decode_audio, pad_or_trim

        def timed(fn):
            times, value = [], None
            for _ in range(repeats):
                t0 = time.perf_counter()
                value = fn()
                times.append(time.perf_counter() - t0)
            return statistics.median(times), value

        decode_s, audio = timed(lambda: decode_audio(path, sampling_rate=16000))
        mel_s, features = timed(lambda: self.model.feature_extractor(audio))
        window = pad_or_trim(features[:, :3000])
        encoder_s, _ = timed(lambda: self.model.encode(window))
        return {"audio_decode_s": decode_s, "mel_s": mel_s, "encoder_window_s": encoder_s}


def main() -> None:
    peer = Peer()
    serve({"load": peer.load, "transcribe": peer.transcribe, "stages": peer.stages})


if __name__ == "__main__":
    main()
