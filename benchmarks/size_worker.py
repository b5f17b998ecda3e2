"""One side of `benchmarks/model_sizes.py` in its own process (not for people).

    .venv/bin/python benchmarks/size_worker.py ours DIR        # a folder built by app.export
    .venv-peer/bin/python benchmarks/size_worker.py ct2 DIR    # a CTranslate2 folder

JSON lines over stdin/stdout (`benchmarks/worker_protocol.py`):
  {"op": "load", "threads"} -> {"load_s", "rss_mb", "peak_rss_mb", "n_mels"}
  {"op": "encode", "reps"} -> {"ms": [per window]}       (one 30 s window, batch 1)
  {"op": "step", "rows", "past", "reps"} -> {"ms": [...], "how"}
  {"op": "rss"}, {"op": "quit"}

ours: `WhisperSessions` with the service's runtime options (`app.main.runtime_options` of the
default `Settings`, threads as given: OpenVINO, precision and activation quantization `auto`, so
bf16 on a CPU with native bf16; until 2026-11-30 this was `RuntimeOptions(threads)`, whose
precision is f32, and the figures before then are f32 with activation quantization on such a
CPU). A step is one `WhisperSessions.decode`
call of T = 1 per row after a past of `past` positions, the rows on one encoded window (as beams
run); each figure is the mean over a batch of calls.

ct2: `ctranslate2.models.Whisper(compute_type="int8", intra_threads=threads)`. CTranslate2 has
no single-step call, so a step is timed through `generate` on the encoder's output (which it does
not encode again): greedy (1 row) or beam search (5 rows = beam 5), end-of-text suppressed so
every run decodes its full length (`max_length` / 2 steps after the prompt); two lengths whose
steps cover 3/4·past .. 5/4·past, alternated; step = (median long - median short) / (steps long -
steps short): the mean step over the positions in between, centred on `past` (the step at `past`
when a step's cost grows linearly with the past, as attention's does), the prompt's prefill
cancelled out. It includes what `generate` does per step besides the decoder (logits
processors, the search's bookkeeping), as faster-whisper pays it.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.worker_protocol import rss, serve

PROMPT = ("<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>")


def features(n_mels: int, batch: int = 1) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.standard_normal((batch, n_mels, 3000)).astype(np.float32)


class Ours:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load(self, threads: int) -> dict:
        from app.config import Settings
        from app.main import runtime_options
        from app.runtime.sessions import WhisperSessions

        started = time.perf_counter()
        self.s = WhisperSessions.load(self.folder, runtime_options(Settings(threads=threads)))
        load_s = time.perf_counter() - started
        self.dims = self.s.manifest.dims
        return {"load_s": load_s, **rss(), "n_mels": self.dims.n_mels}

    def encode(self, reps: int) -> dict:
        x = features(self.dims.n_mels)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            self.cross = self.s.encode(x)
            times.append(1e3 * (time.perf_counter() - started))
        return {"ms": times}

    def step(self, rows: int, past: int, reps: int, calls: int = 20) -> dict:
        d = self.dims
        if not hasattr(self, "cross"):
            self.encode(1)
        rng = np.random.default_rng(1)
        shape = (rows, d.n_heads, past, d.head_dim)
        kv = self.s.kv_dtype
        pasts = [
            rng.standard_normal(shape, dtype=np.float32).astype(kv)
            for _ in range(2 * d.n_text_layer)
        ]
        ids = np.full((rows, 1), 440, np.int64)
        pos = np.full((rows, 1), past, np.int64)
        mask = np.ones((rows, past + 1), np.int64)
        cross = [c[:1] for c in self.cross]
        for _ in range(3):
            self.s.decode(ids, pos, mask, pasts, cross)
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            for _ in range(calls):
                self.s.decode(ids, pos, mask, pasts, cross)
            times.append(1e3 * (time.perf_counter() - started) / calls)
        return {"ms": times, "how": f"decode call, mean of {calls}"}


class CT2:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load(self, threads: int) -> dict:
        import ctranslate2

        self.ct2 = ctranslate2
        started = time.perf_counter()
        self.model = ctranslate2.models.Whisper(
            str(self.folder), device="cpu", compute_type="int8", intra_threads=threads
        )
        load_s = time.perf_counter() - started
        return {"load_s": load_s, **rss(), "n_mels": self.model.n_mels}

    def encode(self, reps: int) -> dict:
        x = self.ct2.StorageView.from_array(features(self.model.n_mels))
        times = []
        for _ in range(reps):
            started = time.perf_counter()
            self.encoded = self.model.encode(x, to_cpu=True)
            times.append(1e3 * (time.perf_counter() - started))
        return {"ms": times}

    def generate(self, rows: int, max_length: int) -> tuple[float, int]:
        started = time.perf_counter()
        result = self.model.generate(
            self.encoded,
            [list(PROMPT)],
            beam_size=rows,
            max_length=max_length,
            suppress_tokens=[self.eot],
            suppress_blank=False,
        )[0]
        return time.perf_counter() - started, len(result.sequences_ids[0])

    def step(self, rows: int, past: int, reps: int) -> dict:
        if not hasattr(self, "encoded"):
            self.encode(1)
        vocabulary = json.loads((self.folder / "vocabulary.json").read_text())
        self.eot = vocabulary.index("<|endoftext|>")
        # generate() prefills the prompt but its last token, then decodes at most max_length / 2
        # steps, the first at past = len(PROMPT) - 1 (CTranslate2's models/whisper.cc)
        first = len(PROMPT) - 1
        counts = (past * 3 // 4 - first, past * 5 // 4 - first)
        self.generate(rows, 20)  # warm-up
        times: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(reps):
            for n in counts:
                seconds, got = self.generate(rows, 2 * n)
                if got != n:
                    raise RuntimeError(f"generate decoded {got} tokens, not {n}")
                times[n].append(seconds)
        short, long = counts
        t = {n: statistics.median(v) for n, v in times.items()}
        ms = 1e3 * (t[long] - t[short]) / (long - short)
        how = (
            f"generate beam {rows}: {short} vs {long} tokens (median of {reps} each), "
            f"difference per step = steps at past {first + short}-{first + long - 1}"
        )
        return {"ms": [ms], "how": how}


def main() -> None:
    kind, folder = sys.argv[1], Path(sys.argv[2])
    side = Ours(folder) if kind == "ours" else CT2(folder)
    serve({"load": side.load, "encode": side.encode, "step": side.step})


if __name__ == "__main__":
    main()
