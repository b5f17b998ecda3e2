"""End to end through the server: one REST request at a time vs faster-whisper int8 and
openvino.genai in process.

For each model a real uvicorn server runs with the service's defaults (batching on, int8 files,
`--threads` threads); faster-whisper int8 runs in its warm worker (`.venv-peer`) and
openvino.genai's `WhisperPipeline` in its own (`.venv-genai`, its IR exported from the same weights
by `benchmarks/genai_model.py`), with the same threads. `--isa AVX2` (or another oneDNN name)
holds all three to that instruction set: `ONEDNN_MAX_CPU_ISA` for OpenVINO, `CT2_FORCE_CPU_ISA`
and `MKL_ENABLE_INSTRUCTIONS` for CTranslate2.

The 60 s clip and the 10 min clip (`--clips`), language English, greedy and beam 5 (the REST
default); one warm-up each, then `--runs` rounds alternating which system goes first. Our time is
the client's (upload, queue, decode, response), with the server's stage split read from /metrics
around each request; the peers' their call (faster-whisper's `transcribe`, openvino.genai's file
read + `generate`).

    .venv/bin/python -m benchmarks.server_speed --models tiny.en,base

Writes benchmarks/results/server_speed.md (`--out-name`).
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import common
from benchmarks.batching import post
from benchmarks.common import REPO
from benchmarks.server import VARIANT_HELP, Server, launch_server, parse_variant

OURS = "ours (server)"
# a pause before each measured call: the last system's worker threads have gone to sleep (Intel
# OpenMP's, faster-whisper's, spin 200 ms after a call; OpenBLAS's ~0.1 s), not spinning on the
# cores the next one measures on
SETTLE_S = 0.5
CLIPS = {"earnings60": lambda: common.EARNINGS, "long10m": common.long_clip}


STAGE_ORDER = [
    "queue_wait", "decode_audio", "vad", "mel", "encoder", "language", "decoder", "search",
    "transcribe", "total",
]  # fmt: skip


def stage_sums(client: httpx.Client, url: str, model: str) -> dict[str, float]:
    """Seconds summed per stage of `model` (`stt_stage_seconds`) in the server's /metrics."""
    text = client.get(url + "/metrics").text
    return {
        sample.labels["stage"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "stt_stage_seconds_sum" and sample.labels.get("model") == model
    }


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--beams", default="1,5")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--clips", default="earnings60,long10m", help="earnings60 and/or long10m")
    p.add_argument("--peers", default="fw-int8,genai-int8", help="benchmarks.common.CONFIGS keys")
    p.add_argument("--isa", default="", help="hold every system to this oneDNN ISA, e.g. AVX2")
    p.add_argument(
        "--device",
        default="CPU",
        choices=("CPU", "NPU"),
        help="our server's device; NPU = the NPU plugin with NPUW on the CPU (STT_NPU_EMULATION)",
    )
    p.add_argument("--out-name", default="server_speed.md")
    p.add_argument(
        "--checkout", type=Path, default=REPO, help="run the server from this source tree"
    )
    p.add_argument("--models-dir", type=Path, default=REPO / "models")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="another of our servers, alternated with the others (its column, and ours ÷ it): "
        + VARIANT_HELP,
    )
    common.add_args(p)
    return p.parse_args()


def measure(model: str, args: argparse.Namespace) -> list[dict]:
    settings = {"STT_THREADS": str(args.threads), "STT_DEVICE": args.device}
    if args.device == "NPU":
        settings["STT_NPU_EMULATION"] = "true"
    server = launch_server(model, args.models_dir, settings, checkout=args.checkout)
    variants = {}
    peers = []
    try:
        for v in map(parse_variant, args.variant):
            variants[v.label] = launch_server(
                model, v.models_dir or args.models_dir, settings | v.settings, v.checkout
            )
        peers = [common.Worker(model, c, args.threads) for c in common.parse_configs(args.peers)]
        with httpx.Client(timeout=1800, trust_env=False) as client:
            return [
                measure_cell(
                    model, CLIPS[clip](), int(beam), args.runs, client, server, peers, variants
                )
                | {"clip": clip}
                for clip in args.clips.split(",")
                for beam in args.beams.split(",")
            ]
    finally:
        for running in (server, *variants.values()):
            running.stop()
        for peer in peers:
            peer.close()


def measure_cell(
    model: str,
    path: Path,
    beam: int,
    runs: int,
    client: httpx.Client,
    server: Server,
    peers: list[common.Worker],
    variants: dict[str, Server],
) -> dict:
    """One clip at one beam size: a warm-up each, then `runs` alternating rounds."""
    audio = path.read_bytes()

    stages: dict[str, float] = {}

    def ours() -> tuple[float, str]:
        before = stage_sums(client, server.url, model)
        answer = post(client, server.url, audio, model, beam)
        for stage, seconds in stage_sums(client, server.url, model).items():
            stages[stage] = stages.get(stage, 0.0) + seconds - before.get(stage, 0.0)
        return answer

    def theirs(peer: common.Worker) -> tuple[float, str]:
        out = peer.transcribe(path, beam)
        return out["total_s"], out["text"]

    def variant(other: Server) -> tuple[float, str]:
        return post(client, other.url, audio, model, beam)

    systems = (
        {OURS: ours}
        | {label: functools.partial(variant, other) for label, other in variants.items()}
        | {p.config.label: functools.partial(theirs, p) for p in peers}
    )
    load = common.load1()
    for run in systems.values():
        run()  # warm-up
    stages.clear()
    times: dict[str, list[float]] = {name: [] for name in systems}
    texts: dict[str, str] = {}
    for r in range(runs):
        for name in common.rotate(list(systems), r):
            time.sleep(SETTLE_S)
            seconds, texts[name] = systems[name]()
            times[name].append(seconds)
            print(f"[{model}] {path.name} beam {beam} {name}: {seconds:.2f} s", file=sys.stderr)
    return {
        "model": model,
        "beam": beam,
        "load": load,
        "times": times,
        "texts": texts,
        "stages_ms": {stage: 1000 * sum_s / runs for stage, sum_s in stages.items()},
        "reference": common.clip_reference(path),
    }


def main() -> None:
    args = parse_args()
    if args.isa:
        os.environ.update(
            ONEDNN_MAX_CPU_ISA=args.isa,
            CT2_FORCE_CPU_ISA=args.isa,
            MKL_ENABLE_INSTRUCTIONS=args.isa,
        )
    load = common.start_load(args)
    rows = [row for m in args.models.split(",") for row in measure(m, args)]
    peers = [parse_variant(v).label for v in args.variant]
    peers += [c.label for c in common.parse_configs(args.peers)]
    held = f", every system held to {args.isa}" if args.isa else ""
    if args.device == "NPU":
        held += (
            ", our server on STT_DEVICE=NPU through the NPU plugin with NPUW on the CPU "
            "(STT_NPU_EMULATION: every shape compiled at start-up, the static cache with prompts "
            "in 32-token chunks, batching on the row counts compiled for it)"
        )
    held += "".join(f"; beside ours the server `{spec}`" for spec in args.variant)
    lines = common.header(
        "Through the server: one REST request vs " + " and ".join(peers),
        load,
        [
            f"Clips: {args.clips} (the 60 s earnings call, the 10 min English testdata clips "
            f"end to end), {args.threads} threads each{held}, medians of {args.runs} "
            "alternating rounds after a warm-up (min–max). Ours: a real uvicorn server with the "
            "service's defaults (batching on, int8 files), timed by the client; the peers in "
            "warm processes on the same weights. `load` = 1-min load average when the cell "
            "started. WER against the clip's reference.",
        ],
    )
    table = []
    for row in rows:
        ours = statistics.median(row["times"][OURS])
        cells = []
        for name in (OURS, *peers):
            t = row["times"][name]
            ref = row["reference"]
            wer = common.wer([ref], [row["texts"][name]])[0] if ref else float("nan")
            cells.append(f"{statistics.median(t):.2f} ({min(t):.2f}–{max(t):.2f}), {wer:.1f} %")
        ratios = [f"{ours / statistics.median(row['times'][name]):.2f}" for name in peers]
        table.append(
            [row["model"], row["clip"], row["beam"], *cells, *ratios, f"{row['load']:.2f}"]
        )
    lines += [
        "",
        *common.table(
            [
                "model",
                "clip",
                "beam",
                "ours s, WER",
                *(f"{n} s, WER" for n in peers),
                *(f"ours ÷ {n}" for n in peers),
                "load",
            ],
            table,
        ),
    ]
    names = sorted({stage for row in rows for stage in row["stages_ms"]}, key=STAGE_ORDER.index)
    lines += [
        "",
        "Our stages from the server's `/metrics` (`stt_stage_seconds` sums read before and after "
        "each measured request, divided by the runs; ms). `transcribe` minus the listed stages "
        "is mostly the file's VAD pass (`vad`) and segmenting; `total` adds the queue and the "
        "response.",
        "",
        *common.table(
            ["model", "clip", "beam", *names],
            [
                [row["model"], row["clip"], row["beam"]]
                + [f"{row['stages_ms'].get(n, 0.0):.0f}" for n in names]
                for row in rows
            ],
        ),
    ]
    common.write(args.out_dir / args.out_name, lines)


if __name__ == "__main__":
    main()
