"""The NPU path's costs, on the NPU plugin with NPUW on the CPU (`STT_NPU_EMULATION`) beside the
CPU: start-up from an empty and from a warm compiled-model cache, and a decoder step's time and
the bytes handed to the runtime per call.

Start-up: `WhisperSessions.load` in a fresh process (every planned shape compiled, or loaded from
the cache). Steps: the 60 s earnings clip, greedy, no VAD, through the engine in this process,
`--runs` rounds alternating the setups, all computing f32 as the emulated NPU's CPU worker does:
the CPU with the service's growing `concat` cache, the CPU on the static cache (448 slots; its
graph compiled for dynamic shapes, so other kernels than a fixed-shape compile), and the emulated
NPU (the static cache on the shapes it compiled). A step hands the runtime its token, the past
self K/V and the window's cross K/V (`KVCache.handed_nbytes`): on a CPU they are read in place,
a device has them copied.

    .venv/bin/python -m benchmarks.static_step --models tiny.en,base

Writes benchmarks/results/static_step.md (`--out-name`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import common
from benchmarks.common import REPO

SETUPS = {
    "CPU, concat cache": ("CPU", "concat"),
    "CPU, static cache": ("CPU", "static"),
    "NPU (NPUW on the CPU)": ("NPU", "static"),
}


def runtime(device: str, threads: int, cache_dir: Path | None = None):
    """As the server sets it up (batching on: the shapes of batched steps compiled too)."""
    from app.runtime.placement import RuntimeOptions
    from app.runtime.static_shapes import batch_rows
    from app.service.batching.records import BatchingOptions

    emulated = device == "NPU"
    return RuntimeOptions(
        device=device, threads=threads, npu_emulation=emulated, cache_dir=cache_dir,
        static_batch_rows=batch_rows(BatchingOptions().max_rows),
    )  # fmt: skip


def load_once(model: str, device: str, threads: int, cache_dir: str) -> None:
    """In a fresh process: load the model; print the seconds and the compiles as JSON."""
    import time

    from app.runtime.graphs import compile_counts
    from app.runtime.sessions import WhisperSessions

    started = time.perf_counter()
    WhisperSessions.load(REPO / "models" / model, runtime(device, threads, Path(cache_dir)))
    counts = {f"{d}/{s}": n for (d, s), n in compile_counts().items()}
    print(json.dumps({"load_s": time.perf_counter() - started, "compiles": counts}))


def startup(model: str, device: str, threads: int) -> list[dict]:
    """Cold (empty cache) then warm (the same cache) start-up, each in a fresh process."""
    with tempfile.TemporaryDirectory() as cache:
        out = []
        for _ in ("cold", "warm"):
            cmd = [
                sys.executable, "-m", "benchmarks.static_step", "--load-once",
                f"{model},{device},{threads},{cache}",
            ]  # fmt: skip
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True)
            out.append(json.loads(done.stdout.strip().splitlines()[-1]))
        return out


def steps(model: str, threads: int, runs: int) -> dict[str, dict]:
    from app.engine.audio import decode_audio
    from app.engine.tokenizer import Tokenizer
    from app.runtime.sessions import WhisperSessions
    from app.service.transcription.options import TranscriptionOptions
    from app.service.transcription.transcriber import Transcriber

    folder = REPO / "models" / model
    audio = decode_audio(common.EARNINGS)
    tokenizer = Tokenizer.from_folder(folder)
    transcribers = {}
    with tempfile.TemporaryDirectory() as cache:
        for name, (device, _) in SETUPS.items():
            sessions = WhisperSessions.load(folder, runtime(device, threads, Path(cache)))
            transcribers[name] = Transcriber(sessions, tokenizer)
    seen: dict[str, dict] = {name: {"ms": [], "total": []} for name in SETUPS}
    for r in range(-1, runs):  # round -1: the warm-up
        for name in common.rotate(list(SETUPS), max(r, 0)):
            options = TranscriptionOptions(
                beam_size=None, vad_filter=False, kv_cache=SETUPS[name][1]
            )
            segments, info = transcribers[name].transcribe(audio, options)
            text = " ".join(s.text for s in segments)
            stats = info.stats
            if r >= 0:
                seen[name]["ms"].append(stats.ms_per_step)
                seen[name]["total"].append(stats.total_s)
            seen[name] |= {
                "handed_mb": stats.handed_per_call / 1e6,
                "calls": stats.decoder_calls,
                "text": text,
                "arithmetic": transcribers[name].sessions.arithmetic["decoder"],
            }
            print(f"[{model}] {name}: {stats.ms_per_step:.2f} ms/step", file=sys.stderr)
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out-name", default="static_step.md")
    p.add_argument("--load-once", default="", help=argparse.SUPPRESS)
    common.add_args(p)
    args = p.parse_args()
    if args.load_once:
        model, device, threads, cache = args.load_once.split(",")
        load_once(model, device, int(threads), cache)
        return
    load = common.start_load(args)
    start_rows, step_rows = [], []
    reference = common.clip_reference(common.EARNINGS)
    for model in args.models.split(","):
        for device in ("CPU", "NPU"):
            cold, warm = startup(model, device, args.threads)
            start_rows.append([
                model, device, f"{cold['load_s']:.2f}", f"{warm['load_s']:.2f}",
                ", ".join(f"{k} {v}" for k, v in sorted(cold["compiles"].items())),
                ", ".join(f"{k} {v}" for k, v in sorted(warm["compiles"].items())),
            ])  # fmt: skip
        for name, seen in steps(model, args.threads, args.runs).items():
            wer = common.wer([reference], [seen["text"]])[0] if reference else float("nan")
            step_rows.append([
                model, name, seen["arithmetic"], f"{statistics.median(seen['ms']):.2f}",
                f"{seen['handed_mb']:.1f}", seen["calls"],
                f"{statistics.median(seen['total']):.2f}", f"{wer:.1f} %",
            ])  # fmt: skip
    lines = common.header(
        "The NPU path: start-up and a decoder step, NPU plugin (NPUW on the CPU) and CPU",
        load,
        [
            f"{args.threads} threads. Start-up: `WhisperSessions.load` in a fresh process, from an "
            "empty compiled-model cache (cold) and from the cache that load filled (warm); "
            "compiles as `stt_graph_compiles_total` counts them (device/source). Steps: the 60 s "
            f"earnings clip, greedy, no VAD, medians of {args.runs} alternating rounds after a "
            "warm-up; handed = the inputs given to the runtime per decoder call (token, mask, "
            "past self K/V, the window's cross K/V).",
        ],
    )
    lines += [
        "",
        *common.table(
            ["model", "device", "cold s", "warm s", "cold compiles", "warm compiles"], start_rows
        ),
        "",
        *common.table(
            [
                "model",
                "setup",
                "decoder computes",
                "ms/step",
                "handed MB/call",
                "calls",
                "total s",
                "WER",
            ],
            step_rows,
        ),
    ]
    common.write(args.out_dir / args.out_name, lines)


if __name__ == "__main__":
    main()
