"""End to end through the server: one REST request at a time vs faster-whisper int8 in process.

For each model a real uvicorn server runs with the service's defaults (batching on, int8 files,
`--threads` threads); faster-whisper int8 runs in its warm worker (`.venv-peer`) with the same
threads and weights. The 60 s clip, language English, greedy and beam 5 (the REST default);
one warm-up each, then `--runs` rounds alternating which system goes first. Our time is the
client's (upload, queue, decode, response); faster-whisper's its `transcribe` call.

    .venv/bin/python benchmarks/server_speed.py --models tiny.en,base

Writes benchmarks/results/server_speed.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402
from benchmarks.api_latency import launch_server  # noqa: E402
from benchmarks.batching import post  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--beams", default="1,5")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--models-dir", type=Path, default=REPO / "models")
    common.add_args(p)
    return p.parse_args()


def measure(model: str, args: argparse.Namespace) -> list[dict]:
    server = launch_server(model, args.models_dir, {"STT_THREADS": str(args.threads)})
    peer = common.Worker(model, common.CONFIGS["fw-int8"], args.threads)
    audio = common.EARNINGS.read_bytes()
    rows = []
    try:
        with httpx.Client(timeout=600, trust_env=False) as client:

            def ours(beam: int) -> tuple[float, str]:
                return post(client, server.url, audio, model, beam)

            def theirs(beam: int) -> tuple[float, str]:
                out = peer.transcribe(common.EARNINGS, beam)
                return out["total_s"], out["text"]

            systems = {"ours (server)": ours, "faster-whisper int8": theirs}
            for beam in [int(b) for b in args.beams.split(",")]:
                load = common.load1()
                for run in systems.values():
                    run(beam)  # warm-up
                times: dict[str, list[float]] = {name: [] for name in systems}
                texts: dict[str, str] = {}
                for r in range(args.runs):
                    for name in common.rotate(list(systems), r):
                        seconds, texts[name] = systems[name](beam)
                        times[name].append(seconds)
                        print(f"[{model}] beam {beam} {name}: {seconds:.2f} s", file=sys.stderr)
                rows.append(
                    {"model": model, "beam": beam, "load": load, "times": times, "texts": texts}
                )
    finally:
        server.stop()
        peer.close()
    return rows


def main() -> None:
    args = parse_args()
    load = common.start_load(args)
    rows = [row for m in args.models.split(",") for row in measure(m, args)]
    reference = common.clip_reference(common.EARNINGS)
    lines = common.header(
        "Through the server: one REST request vs faster-whisper int8",
        load,
        [
            f"The 60 s clip, {args.threads} threads each, medians of {args.runs} alternating "
            "rounds after a warm-up (min–max). Ours: a real uvicorn server with the service's "
            "defaults (batching on, int8 files, activation quantization auto), timed by the "
            "client; faster-whisper int8 in a warm process. `load` = 1-min load average when "
            "the cell started. WER against the clip's reference.",
        ],
    )
    table = []
    for row in rows:
        ours = statistics.median(row["times"]["ours (server)"])
        theirs = statistics.median(row["times"]["faster-whisper int8"])
        cells = []
        for name in ("ours (server)", "faster-whisper int8"):
            t = row["times"][name]
            wer = common.wer([reference], [row["texts"][name]])[0] if reference else float("nan")
            cells.append(f"{statistics.median(t):.2f} ({min(t):.2f}–{max(t):.2f}), {wer:.1f} %")
        table.append(
            [row["model"], row["beam"], *cells, f"{ours / theirs:.2f}", f"{row['load']:.2f}"]
        )
    lines += [
        "",
        *common.table(
            ["model", "beam", "ours s, WER", "faster-whisper s, WER", "ours ÷ fw", "load"], table
        ),
    ]
    common.write(args.out_dir / "server_speed.md", lines)


if __name__ == "__main__":
    main()
