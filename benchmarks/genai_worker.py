"""Warm worker process for openvino.genai's `WhisperPipeline` (run with .venv-genai's Python; see
`make bench-genai-setup` and `benchmarks/genai_model.py`). Imports nothing from the project but
the standard-library-only `benchmarks/worker_protocol.py`.

  {"op": "load", "model_dir", "threads", "device"?, "properties"?} -> {"load_s", "rss_mb"}
  {"op": "transcribe", "path", "beam_size", "language"?} -> {"text", "total_s", "audio_s"}
  {"op": "rss"};  {"op": "quit"}
End-to-end time = reading and resampling the file (soundfile, as faster-whisper's decode_audio
does its own) + `WhisperPipeline.generate` on the samples. Long audio is transcribed by the
pipeline's own sequential 30 s windows (timestamps on, as its long-form mode needs).
"""

from __future__ import annotations

import time

from benchmarks.worker_protocol import rss, serve

SAMPLE_RATE = 16000
# openvino.genai's own NPU Whisper tests (WhisperStaticPipeline on NPUW:CPU): the NPU plugin's
# partitioner with the CPU as its worker, on a machine without an NPU
NPU_ON_CPU = {"NPU_USE_NPUW": "YES", "NPUW_DEVICES": "CPU", "NPUW_ONLINE_PIPELINE": "NONE"}


def read_audio(path: str):
    """f32 mono 16 kHz samples."""
    import numpy as np
    import soundfile as sf

    audio, rate = sf.read(path, dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if rate != SAMPLE_RATE:
        import soxr

        audio = soxr.resample(audio, rate, SAMPLE_RATE)
    return np.ascontiguousarray(audio, dtype=np.float32)


class GenAI:
    def __init__(self) -> None:
        self.pipe = None
        self.multilingual = False

    def load(
        self, model_dir: str, threads: int, device: str = "CPU", properties: dict | None = None
    ) -> dict:
        """properties: CPU plugin properties over its own defaults (held to a smaller kind)."""
        started = time.perf_counter()
        import openvino_genai

        if device == "NPU":
            self.pipe = openvino_genai.WhisperPipeline(model_dir, "NPU", **NPU_ON_CPU)
        else:
            self.pipe = openvino_genai.WhisperPipeline(
                model_dir, "CPU", INFERENCE_NUM_THREADS=threads, **(properties or {})
            )
        self.multilingual = self.pipe.get_generation_config().is_multilingual
        return {"load_s": time.perf_counter() - started, **rss()}

    def transcribe(self, path: str, beam_size: int, language: str | None = "en", **_) -> dict:
        t0 = time.perf_counter()
        audio = read_audio(path)
        options: dict = {"num_beams": beam_size, "return_timestamps": len(audio) > 30 * SAMPLE_RATE}
        if self.multilingual:
            options |= {
                "task": "transcribe",
                **({"language": f"<|{language}|>"} if language else {}),
            }
        result = self.pipe.generate(audio.tolist(), **options)
        total = time.perf_counter() - t0
        return {
            "text": result.texts[0].strip(),
            "total_s": total,
            "audio_s": len(audio) / SAMPLE_RATE,
        }


if __name__ == "__main__":
    worker = GenAI()
    serve({"load": worker.load, "transcribe": worker.transcribe})
