"""KV cache: decoder time per token against position for the `concat`, `static` and `none` caches.

Per-token timing: the first 30 s window of the 60 s earnings clip is encoded once; the decoder is
then fed a fixed, real token sequence (the transcript tokens of that clip, timestamps included,
after the sot sequence) one token per step through each cache strategy of `app.engine.kv_cache`,
as the decode loop does, and every `forward` call is timed. Teacher forcing keeps the sequence
the same for every strategy (the work of a step does not depend on the token's value); positions
run up to `--positions` generated tokens (a real window starts after up to 223 prompt tokens, so
positions past 224 occur). Batch 1 is greedy; batch 5 is beam search's shape (the cache forked to
5 rows after the prefill). Strategies alternate within every repeat; figures are medians over
repeats per position.

End to end: the transcriber on the 60 s clip with each strategy (greedy and beam 5).

    .venv/bin/python -m benchmarks.kv_cache               # tiny.en + base, ~10 min
    .venv/bin/python -m benchmarks.kv_cache --quick       # tiny.en, batch 1, 1 repeat

Writes benchmarks/results/kv_cache.md and kv_cache_<model>.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from app.engine.audio import decode_audio
from app.engine.kv_cache import make_cache
from app.engine.mel import log_mel_spectrogram, pad_or_trim
from app.engine.tokenizer import Tokenizer
from app.runtime.contract import N_FRAMES
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from benchmarks import common

MODES = ("concat", "static", "none")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--ep", default="openvino", choices=["openvino", "cpu"])
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--positions", type=int, default=300, help="generated tokens fed (max 440)")
    p.add_argument("--batches", default="1,5", help="rows: 1 = greedy, 5 = beam 5")
    p.add_argument("--repeats", type=int, default=3, help="per-token repeats (medians)")
    p.add_argument("--e2e-runs", type=int, default=3, help="end-to-end runs per cell (medians)")
    p.add_argument("--e2e-beams", default="1,5")
    p.add_argument("--quick", action="store_true", help="tiny.en, batch 1, 1 repeat, 1 e2e run")
    common.add_args(p)
    args = p.parse_args()
    if args.quick:
        args.models, args.batches, args.repeats, args.e2e_runs = "tiny.en", "1", 1, 1
        args.positions = min(args.positions, 200)
    return args


def token_sequence(
    transcriber: Transcriber, tokenizer: Tokenizer, audio: np.ndarray, n: int
) -> list[int]:
    """n real tokens (text + timestamps) from transcribing `audio`, repeated if short."""
    segments, _ = transcriber.transcribe(audio, TranscriptionOptions(language="en", beam_size=1))
    tokens = [t for s in segments for t in s.tokens]
    while len(tokens) < n:
        tokens = tokens + tokens
    return tokens[:n]


def per_token(
    sessions: WhisperSessions,
    cross: list[np.ndarray],
    initial: list[int],
    body: list[int],
    mode: str,
    batch: int,
) -> list[float]:
    """Seconds of each step's cache.forward, step k feeding body[k] at position len(initial)+k."""
    seq = np.asarray([initial + body], np.int64)
    prefill = make_cache(mode, sessions, cross, 1)
    prefill.forward(seq[:, : len(initial)])
    cache = prefill.fork(batch)
    rows = np.repeat(seq, batch, axis=0)
    times = []
    for k in range(len(body)):
        t0 = time.perf_counter()
        cache.forward(rows[:, : len(initial) + k + 1])
        times.append(time.perf_counter() - t0)
    return times


def measure_model(model: str, args: argparse.Namespace) -> dict:
    folder = common.MODELS_DIR / model
    sessions = WhisperSessions.load(folder, RuntimeOptions(ep=args.ep, threads=args.threads))
    tokenizer = Tokenizer.from_folder(folder, sessions.manifest)
    transcriber = Transcriber(sessions, tokenizer)
    audio = decode_audio(common.EARNINGS)
    mel = log_mel_spectrogram(audio, sessions.manifest.dims.n_mels)
    cross = sessions.encode(np.ascontiguousarray(pad_or_trim(mel, N_FRAMES)[None]))
    language = "en" if tokenizer.multilingual else None
    initial = list(tokenizer.sot_sequence(language, "transcribe", without_timestamps=False))
    n = min(args.positions, sessions.manifest.dims.n_text_ctx - len(initial) - 1)
    body = token_sequence(transcriber, tokenizer, audio, n)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    batches = [int(b) for b in args.batches.split(",")]

    curves: dict[tuple[str, int], list[list[float]]] = {}
    for batch in batches:
        for mode in modes:  # warm-up (shapes, allocator)
            per_token(sessions, cross, initial, body[:32], mode, batch)
        for r in range(args.repeats):
            order = common.rotate(modes, r)
            for mode in order:
                times = per_token(sessions, cross, initial, body, mode, batch)
                curves.setdefault((mode, batch), []).append(times)
                ms = 1e3 * sum(times) / len(times)
                print(f"[{model}] batch {batch} {mode}: {ms:.2f} ms/token", file=sys.stderr)
    medians = {
        key: [statistics.median(col) for col in zip(*runs, strict=True)]
        for key, runs in curves.items()
    }

    e2e: dict[tuple[str, int], list[dict]] = {}
    beams = [int(b) for b in args.e2e_beams.split(",")]
    for beam in beams:
        for mode in modes:  # warm-up
            _transcribe(transcriber, audio, mode, beam)
        for r in range(args.e2e_runs):
            order = common.rotate(modes, r)
            for mode in order:
                e2e.setdefault((mode, beam), []).append(_transcribe(transcriber, audio, mode, beam))
    return {
        "initial": len(initial),
        "n": n,
        "medians": medians,
        "e2e": e2e,
        "devices": sessions.devices,
    }


def _transcribe(transcriber: Transcriber, audio: np.ndarray, mode: str, beam: int) -> dict:
    t0 = time.perf_counter()
    segments, info = transcriber.transcribe(
        audio, TranscriptionOptions(language="en", beam_size=beam, kv_cache=mode)
    )
    text = "".join(s.text for s in segments)
    return {"total_s": time.perf_counter() - t0, "text": text, **info.stats.as_dict()}


def window_mean(values: list[float], lo: int, hi: int) -> float:
    part = values[lo:hi]
    return 1e3 * sum(part) / len(part) if part else float("nan")


def report(results: dict[str, dict], args: argparse.Namespace, load_before: float) -> list[str]:
    lines = common.header(
        "KV cache strategies: decoder time per token",
        load_before,
        [
            f"EP {args.ep}, {args.threads} threads, fp32 files. Per-token figures: one 30 s window "
            f"(earnings clip), a fixed real token sequence fed one token per decoder call, "
            f"{args.repeats} repeat(s) per strategy, alternating; median per position, then the "
            "mean over a range of generated-token indices (ms per step; a step of batch 5 "
            "produces 5 rows' tokens). `none ÷ concat` is how many times faster the cache is.",
        ],
    )
    lines += ["", "## ms per decoder step by generated-token index", ""]
    rows = []
    for model, res in results.items():
        n = res["n"]
        ranges = [(0, 25), (25, 100), (100, 200), (200, n), (100, n)]
        ranges = list(dict.fromkeys((lo, min(hi, n)) for lo, hi in ranges if lo < n))
        batches = sorted({b for _, b in res["medians"]})
        for batch in batches:
            for lo, hi in ranges:
                cells = {
                    m: window_mean(res["medians"][(m, batch)], lo, hi)
                    for m, b in res["medians"]
                    if b == batch
                }
                nan = float("nan")
                speedup = cells.get("none", nan) / cells.get("concat", nan)
                static_speedup = cells.get("none", nan) / cells.get("static", nan)
                rows.append(
                    [
                        model,
                        batch,
                        f"{lo}–{hi - 1}",
                        *(f"{cells.get(m, float('nan')):.2f}" for m in MODES),
                        f"{speedup:.1f}×",
                        f"{static_speedup:.1f}×",
                    ]
                )
    lines += common.table(
        [
            "model",
            "batch",
            "tokens",
            "concat ms",
            "static ms",
            "none ms",
            "none ÷ concat",
            "none ÷ static",
        ],
        rows,
    )
    lines += ["", "## End to end, 60 s earnings clip (medians)", ""]
    rows = []
    for model, res in results.items():
        for (mode, beam), samples in res["e2e"].items():
            total = statistics.median(s["total_s"] for s in samples)
            dec = statistics.median(s["decoder_s"] for s in samples)
            prefill = statistics.median(s["prefill_s"] for s in samples)
            steps = statistics.median(s["steps"] for s in samples)
            rows.append(
                [
                    model,
                    beam,
                    mode,
                    len(samples),
                    f"{total:.2f}",
                    f"{total / samples[0]['audio_s']:.3f}",
                    f"{prefill:.2f}",
                    f"{dec:.2f}",
                    f"{1e3 * dec / steps:.2f}" if steps else "-",
                    f"{samples[-1]['cache_nbytes'] / 1e6:.1f}",
                ]
            )
    lines += common.table(
        [
            "model",
            "beam",
            "cache",
            "runs",
            "end-to-end s",
            "RTF",
            "prefill s",
            "decoder s",
            "ms/step",
            "peak K/V MB",
        ],
        rows,
    )
    return lines


def plot(results: dict[str, dict], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for model, res in results.items():
        batches = sorted({b for _, b in res["medians"]})
        fig, axes = plt.subplots(1, len(batches), figsize=(6 * len(batches), 4.2), squeeze=False)
        for ax, batch in zip(axes[0], batches, strict=True):
            for mode in MODES:
                values = res["medians"].get((mode, batch))
                if values is None:
                    continue
                ax.plot(range(len(values)), [1e3 * v for v in values], label=mode, lw=1)
            ax.set_title(f"{model}, batch {batch} ({'greedy' if batch == 1 else 'beam'})")
            ax.set_xlabel(f"generated token index (position − {res['initial']})")
            ax.set_ylabel("ms per decoder step")
            ax.set_yscale("log")
            ax.grid(alpha=0.3, which="both")
            ax.legend()
        fig.tight_layout()
        path = out_dir / f"kv_cache_{model}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    args = parse_args()
    load_before = common.start_load(args)
    started = time.time()
    results = {m: measure_model(m, args) for m in args.models.split(",")}
    lines = report(results, args, load_before)
    lines += ["", f"Wall time: {(time.time() - started) / 60:.1f} min."]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for path in plot(results, args.out_dir):
        lines += ["", f"![{path.stem}]({path.name})"]
    common.write(args.out_dir / ("kv_cache_quick.md" if args.quick else "kv_cache.md"), lines)


if __name__ == "__main__":
    main()
