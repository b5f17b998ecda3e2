"""Cross-request batching: decoder rows per step, concurrent REST clients and live streams, on/off.

Three parts (each can be picked with --parts):

- `rows`: decoder tokens/s summed over rows against rows per call. In-process, one decoder call
  with R rows, each on its own 30 s window (a different slab slot, as the scheduler runs them),
  past length 100 and 200; median of `--repeats` calls after warm-up. ms/step and tokens/s per R.
- `rest`: a real uvicorn server per model and mode (STT_BATCHING=true / false, STT_WORKERS =
  clients, STT_THREADS=2). "8 at once vs one after another": the 60 s testdata clip sent 8 times
  sequentially, then by 8 clients at once; wall times, speed-up and whether all transcripts are
  identical. Then 1, 2, 4, 8, 16 concurrent clients each posting the 60 s clip `--per-client`
  times: aggregate audio seconds per second, p50/p95 latency, and (batching on) mean rows per
  decoder step from /metrics. Decoding: `--beam` (default 1 = greedy; the REST default is 5).
- `streams`: N live WebSocket streams of the 60 s clip at real-time pace at once (N in
  `--streams`), batching on vs off; per stream the median word commit latency as
  benchmarks/stream_latency.py measures it (forced-aligned word ends), then the median over
  streams. "Sustained" = every stream's median commit latency <= 2.0 s and done <= 3 s after
  its audio ended.

    .venv/bin/python -m benchmarks.batching                      # everything, ~30 min
    .venv/bin/python -m benchmarks.batching --parts rows --models tiny.en,base
    .venv/bin/python -m benchmarks.batching --quick              # tiny.en, fewer levels

Writes benchmarks/results/batching.md (and batching.png: tokens/s against rows).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path

import httpx
import numpy as np

from app.api.metrics import batch_rows
from benchmarks import common
from benchmarks import stream_latency as live
from benchmarks.api_latency import run_clients
from benchmarks.common import REPO
from benchmarks.load import percentile
from benchmarks.server import launch_server, start_server

SUSTAINED_COMMIT_S = 2.0
SUSTAINED_DONE_S = 3.0


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="rows,rest,streams", help="of rows, rest, streams")
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--rows", default="1,2,4,8,16", help="rows per decoder call (part rows)")
    p.add_argument("--clients", default="1,2,4,8,16", help="concurrent REST clients")
    p.add_argument("--per-client", type=int, default=2, help="60 s requests per client")
    p.add_argument("--streams", default="1,2,4,8", help="concurrent live streams")
    p.add_argument("--beam", type=int, default=1, help="REST beam size (default 1 = greedy)")
    p.add_argument("--repeats", type=int, default=15, help="decoder calls per point (rows)")
    p.add_argument("--models-dir", type=Path, default=REPO / "models")
    p.add_argument("--modes", default="on,off", help="batching on, off or both")
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="STT_NAME=VALUE",
        help="another service setting for every server (repeatable)",
    )
    p.add_argument("--quick", action="store_true", help="tiny.en, fewer levels")
    p.add_argument(
        "--checkout", type=Path, default=REPO, help="run the servers from this source tree"
    )
    common.add_args(p)
    args = p.parse_args()
    args.settings = dict(item.split("=", 1) for item in args.setting)
    if args.quick:
        args.models, args.clients, args.streams, args.per_client = "tiny.en", "1,4,8", "1,4", 1
    return args


# ---- rows: decoder tokens/s against rows per call -----------------------------------------------
def rows_part(model: str, args: argparse.Namespace) -> list[dict]:
    from app.runtime.placement import RuntimeOptions
    from app.runtime.sessions import WhisperSessions
    from app.service.batching.cross_slab import CrossSlab

    sessions = WhisperSessions.load(
        args.models_dir / model, RuntimeOptions(threads=args.threads, inference_precision="auto")
    )
    dims = sessions.manifest.dims
    rng = np.random.default_rng(0)
    features = (rng.standard_normal((1, dims.n_mels, 3000)) * 0.1).astype(np.float32)
    encoded = sessions.encode(features)
    counts = [int(r) for r in args.rows.split(",")]
    slab = CrossSlab(encoded, max(counts))
    held = [slab.store(encoded, 0) for _ in range(max(counts))]  # distinct slots, as in serving
    results = []
    for past_len in (100, 200):
        for rows in counts:
            cross = slab.view(0, rows)
            past = [
                rng.standard_normal((rows, dims.n_heads, past_len, dims.head_dim)).astype(
                    np.float32
                )
                for _ in range(2 * dims.n_text_layer)
            ]
            ids = np.full((rows, 1), 440, np.int64)
            positions = np.full((rows, 1), past_len, np.int64)
            mask = np.ones((rows, past_len + 1), np.int64)
            for _ in range(3):
                sessions.decode(ids, positions, mask, past, cross)
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                sessions.decode(ids, positions, mask, past, cross)
                times.append(time.perf_counter() - t0)
            ms = 1000 * statistics.median(times)
            results.append({"model": model, "past": past_len, "rows": rows, "ms": ms})
            print(f"rows {model} P={past_len} R={rows}: {ms:.1f} ms/step", flush=True)
    del held
    return results


# ---- rest: concurrent clients, batching on vs off -----------------------------------------------
def post(client: httpx.Client, url: str, audio: bytes, model: str, beam: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = client.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", audio, "audio/wav")},
        data={"model": model, "beam_size": str(beam), "response_format": "text"},
    )
    r.raise_for_status()
    return time.perf_counter() - t0, r.text


def decode_rows(url: str, model: str) -> tuple[float, float]:
    """(sum, count) of stt_batch_rows for decode steps (0, 0 when batching is off)."""
    return batch_rows(httpx.get(url + "/metrics", timeout=10).text, model)


def clients_level(url: str, model: str, audio: bytes, clients: int, per_client: int, beam: int):
    rows0 = decode_rows(url, model)
    answers, errors, wall = run_clients(
        clients, per_client, lambda c: post(c, url, audio, model, beam), timeout_s=1800
    )
    latencies = [seconds for seconds, _ in answers]
    texts = [text for _, text in answers]
    rows1 = decode_rows(url, model)
    steps = rows1[1] - rows0[1]
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "wall_s": wall,
        "audio_s_per_s": len(latencies) * common.clip_duration(common.EARNINGS) / wall,
        "p50": percentile(latencies, 0.5) if latencies else float("nan"),
        "p95": percentile(latencies, 0.95) if latencies else float("nan"),
        "rows_per_step": (rows1[0] - rows0[0]) / steps if steps else float("nan"),
        "texts": texts,
    }


def rest_part(model: str, batching: bool, args: argparse.Namespace) -> dict:
    levels = [int(c) for c in args.clients.split(",")]
    server = start_server(
        model,
        args.models_dir,
        workers=max(*levels, 8),
        threads=args.threads,
        ep="openvino",
        extra_env={
            "STT_BATCHING": str(batching).lower(),
            "STT_BATCH_MAX_ROWS": "16",
            **args.settings,
        },
        checkout=args.checkout,
    )
    audio = common.EARNINGS.read_bytes()
    try:
        with httpx.Client(timeout=600) as c:
            post(c, server.url, audio, model, args.beam)  # warm-up
        one_by_one = clients_level(server.url, model, audio, 1, 8, args.beam)
        at_once = clients_level(server.url, model, audio, 8, 1, args.beam)
        curve = [
            clients_level(server.url, model, audio, n, args.per_client, args.beam) for n in levels
        ]
        for level in curve:
            print(
                f"rest {model} batching={batching} clients={level['clients']}: "
                f"{level['audio_s_per_s']:.1f} audio s/s, p50 {level['p50']:.2f} s",
                flush=True,
            )
    finally:
        server.stop()
    return {"eight": (one_by_one, at_once), "curve": curve}


# ---- streams: N live streams at real-time pace --------------------------------------------------
def streams_part(model: str, batching: bool, args: argparse.Namespace) -> list[dict]:
    levels = [int(n) for n in args.streams.split(",")]
    env = {
        "STT_BATCHING": str(batching).lower(),
        "STT_THREADS": str(args.threads),
        "STT_STREAM_MAX_SESSIONS": str(max(levels)),
        "STT_WORKERS": str(max(*levels, 8)),
        **args.settings,
    }
    server = launch_server(model, args.models_dir, env, args.checkout)
    path = live.CLIPS["earnings60"]
    audio = live.load_audio(path)
    wire = live.soxr_resample(audio, live.SR, live.WIRE_RATE)  # the Realtime protocol's 24 kHz
    pcm24 = (np.clip(wire, -1, 1) * 32767).astype("<i2").tobytes()
    out = []
    try:
        rest = live.rest_verbose(server.url, path, model)
        ref = live.reference_words(model, audio, rest["segments"])
        truth = common.clip_reference(path) or ""
        for n in levels:
            runs = asyncio.run(live.stream_many(server.url, pcm24, n))
            stats = [live.analyse([run], ref, rest["text"], truth) for run in runs]
            medians = [s["median_s"] for s in stats]
            dones = [s["done_after_end_s"] for s in stats]
            row = {
                "model": model,
                "batching": batching,
                "streams": n,
                "median_commit_s": statistics.median(medians),
                "worst_median_s": max(medians),
                "worst_done_s": max(dones),
                "wer": statistics.mean(s["wer_vs_rest"] for s in stats),
                "errors": sum(e["type"] == "error" for run in runs for _, e in run.events),
                "sustained": max(medians) <= SUSTAINED_COMMIT_S and max(dones) <= SUSTAINED_DONE_S,
            }
            out.append(row)
            print(f"streams {row}", flush=True)
    finally:
        server.stop()
    return out


# ---- report --------------------------------------------------------------------------------------
def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for model in dict.fromkeys(r["model"] for r in rows):
        for past_len in (100, 200):
            pts = [r for r in rows if r["model"] == model and r["past"] == past_len]
            ax.plot(
                [r["rows"] for r in pts],
                [1000 * r["rows"] / r["ms"] for r in pts],
                marker="o",
                label=f"{model}, past {past_len}",
            )
    ax.set_xlabel("rows per decoder call (each on its own window)")
    ax.set_ylabel("decoder tokens/s (all rows)")
    ax.set_xscale("log", base=2)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def report(results: dict, args: argparse.Namespace, load_before: float) -> list[str]:
    lines = common.header(
        "Cross-request batching",
        load_before,
        [
            f"REST decoding: beam {args.beam} (1 = greedy), timestamps, temperature fallback."
            + (f" Settings: {', '.join(args.setting)}." if args.setting else "")
        ],
    )
    if results.get("rows"):
        lines += ["", "## Decoder tokens/s against rows per call", ""]
        table = []
        for r in results["rows"]:
            one = next(
                x["ms"]
                for x in results["rows"]
                if (x["model"], x["past"], x["rows"]) == (r["model"], r["past"], 1)
            )
            gain = (r["rows"] / r["ms"]) / (1 / one)
            table.append(
                [r["model"], r["past"], r["rows"], f"{r['ms']:.1f}",
                 f"{1000 * r['rows'] / r['ms']:.0f}", f"{gain:.2f}×"]
            )  # fmt: skip
        lines += common.table(["model", "past", "rows", "ms/step", "tokens/s", "vs 1 row"], table)
        lines += ["", "![tokens/s against rows](batching.png)"]
    if results.get("rest"):
        lines += ["", "## 8 requests of the 60 s clip: at once vs one after another", ""]
        table = []
        for (model, batching), r in results["rest"].items():
            seq, par = r["eight"]
            same = len(set(seq["texts"] + par["texts"])) == 1
            table.append(
                [model, "on" if batching else "off", f"{seq['wall_s']:.1f}",
                 f"{par['wall_s']:.1f}", f"{seq['wall_s'] / par['wall_s']:.2f}×",
                 "yes" if same else "NO", f"{par['rows_per_step']:.2f}"]
            )  # fmt: skip
        lines += common.table(
            ["model", "batching", "one after another (s)", "8 at once (s)", "speed-up",
             "transcripts identical", "rows/step"],
            table,
        )  # fmt: skip
        lines += ["", "## Concurrent REST clients (60 s clip)", ""]
        table = []
        for (model, batching), r in results["rest"].items():
            for level in r["curve"]:
                table.append(
                    [model, "on" if batching else "off", level["clients"], level["requests"],
                     level["errors"], f"{level['audio_s_per_s']:.1f}", f"{level['p50']:.2f}",
                     f"{level['p95']:.2f}", f"{level['rows_per_step']:.2f}"]
                )  # fmt: skip
        lines += common.table(
            ["model", "batching", "clients", "requests", "errors", "audio s/s", "p50 s", "p95 s",
             "rows/step"],
            table,
        )  # fmt: skip
    if results.get("streams"):
        lines += ["", "## Live WebSocket streams at real-time pace (60 s clip each)", ""]
        table = []
        for r in results["streams"]:
            table.append(
                [r["model"], "on" if r["batching"] else "off", r["streams"],
                 f"{r['median_commit_s']:.2f}", f"{r['worst_median_s']:.2f}",
                 f"{r['worst_done_s']:.2f}", f"{100 * r['wer']:.1f} %", r["errors"],
                 "yes" if r["sustained"] else "no"]
            )  # fmt: skip
        lines += common.table(
            ["model", "batching", "streams", "median commit latency s", "worst stream's median s",
             "worst done after end s", "WER vs REST", "errors", "sustained"],
            table,
        )  # fmt: skip
    return lines


def main() -> None:
    args = parse_args()
    load_before = common.start_load(args)
    parts = set(args.parts.split(","))
    models = args.models.split(",")
    results: dict = {"rows": [], "rest": {}, "streams": []}
    for model in models:
        if "rows" in parts:
            results["rows"] += rows_part(model, args)
    for model in models:
        for batching in [mode == "on" for mode in args.modes.split(",")]:
            if "rest" in parts:
                results["rest"][(model, batching)] = rest_part(model, batching, args)
            if "streams" in parts:
                results["streams"] += streams_part(model, batching, args)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    if results["rows"]:
        plot(results["rows"], args.out_dir / "batching.png")
    out = args.out_dir / f"batching{suffix}.md"
    common.write(out, report(results, args, load_before))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
