"""Load: requests/s and p50/p95 latency with 1, 2, 4 and 8 concurrent REST clients.

A real uvicorn server (started as benchmarks/api_latency.py does, whose server and request code
this reuses) with STT_THREADS=2 and STT_WORKERS as given; each of N clients (threads with their
own HTTP connection) posts jfk.wav to /v1/audio/transcriptions (json, server-default decoding:
beam 5, timestamps, fallback) back to back, `--per-client` requests each after one warm-up
request. Latency = send to full response, per request; requests/s = requests / wall time of the
level; audio s/s = requests/s × 11 s. Levels run one after the other on the same server.

    .venv/bin/python -m benchmarks.load                  # tiny.en and base, ~8 min
    .venv/bin/python -m benchmarks.load --quick          # tiny.en, 1/2/4 clients, fewer requests
    .venv/bin/python -m benchmarks.load --url http://127.0.0.1:8000 --models base

Writes benchmarks/results/load.md and load.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks import common
from benchmarks.api_latency import run_clients, transcribe
from benchmarks.server import start_server


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="measure this running server (one model) instead of starting one")
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--clients", default="1,2,4,8")
    p.add_argument(
        "--per-client",
        default="16,8,4,3",
        help="requests per client at each level (comma list, or one number)",
    )
    p.add_argument("--workers", type=int, default=1, help="STT_WORKERS")
    p.add_argument("--ep", default="openvino", choices=["openvino", "cpu"])
    p.add_argument("--precision", default="auto", help="STT_PRECISION (default: auto)")
    p.add_argument("--quick", action="store_true")
    common.add_args(p)
    args = p.parse_args()
    if args.quick:
        args.models = "tiny.en"
        if args.clients == "1,2,4,8" and args.per_client == "16,8,4,3":
            args.clients, args.per_client = "1,2,4", "6,3,2"
    return args


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def level(url: str, audio: bytes, model: str, clients: int, per_client: int) -> dict:
    def send(client: httpx.Client) -> float:
        return transcribe(client, url, audio, model)

    latencies, errors, wall = run_clients(clients, per_client, send, warm_up=send)
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "wall_s": wall,
        "rps": len(latencies) / wall,
        "p50": percentile(latencies, 0.5),
        "p95": percentile(latencies, 0.95),
        "max": max(latencies),
        "mean": statistics.mean(latencies),
        "load": common.load1(),
    }


def plot(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for model, rows in results.items():
        xs = [r["clients"] for r in rows]
        a.plot(xs, [r["rps"] for r in rows], marker="o", label=model)
        b.plot(xs, [r["p50"] for r in rows], marker="o", label=f"{model} p50")
        b.plot(xs, [r["p95"] for r in rows], marker="x", ls="--", label=f"{model} p95")
    a.set_title("throughput (jfk, 11 s)")
    a.set_xlabel("concurrent clients")
    a.set_ylabel("requests/s")
    b.set_title("latency")
    b.set_xlabel("concurrent clients")
    b.set_ylabel("seconds")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    a.set_ylim(bottom=0)
    b.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args = parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    per = [int(p) for p in args.per_client.split(",")]
    per = per * len(clients) if len(per) == 1 else per
    if len(per) != len(clients):
        raise SystemExit("--per-client needs one number or one per --clients level")
    audio = common.JFK.read_bytes()
    load_before = common.start_load(args)
    started = time.time()
    results: dict[str, list[dict]] = {}
    for model in args.models.split(","):
        server = None
        url = args.url.rstrip("/") if args.url else None
        if url is None:
            server = start_server(
                model,
                common.MODELS_DIR,
                args.workers,
                args.threads,
                args.ep,
                extra_env={"STT_PRECISION": args.precision},
            )
            url = server.url
        try:
            for n, k in zip(clients, per, strict=True):
                r = level(url, audio, model, n, k)
                results.setdefault(model, []).append(r)
                print(
                    f"[{model}] {n} clients: {r['rps']:.2f} req/s, p50 {r['p50']:.2f} s, "
                    f"p95 {r['p95']:.2f} s",
                    file=sys.stderr,
                )
        finally:
            if server is not None:
                server.stop()

    lines = common.header(
        "Load: concurrent REST clients",
        load_before,
        [
            f"Server: {'external ' + args.url if args.url else 'uvicorn started here'}, "
            f"STT_WORKERS={args.workers}, STT_THREADS={args.threads}, EP {args.ep}, "
            f"STT_PRECISION={args.precision} "
            "(auto = bf16 on this CPU), fp32 files. "
            "Each client posts jfk.wav (11 s) back to back (json; server defaults: beam 5, "
            "timestamps, fallback); one uncounted warm-up request per client. The 2 cores are "
            "shared by all requests: with one worker, requests queue (STT_MAX_QUEUE=64 here).",
        ],
    )
    lines += [""]
    rows = []
    for model, levels in results.items():
        for r in levels:
            rows.append(
                [
                    model,
                    r["clients"],
                    r["requests"],
                    r["errors"],
                    f"{r['wall_s']:.1f}",
                    f"{r['rps']:.2f}",
                    f"{r['rps'] * 11.0:.1f}",
                    f"{r['p50']:.2f}",
                    f"{r['p95']:.2f}",
                    f"{r['max']:.2f}",
                    f"{r['load']:.2f}",
                ]
            )
    lines += common.table(
        [
            "model",
            "clients",
            "requests",
            "errors",
            "wall s",
            "requests/s",
            "audio s/s",
            "p50 s",
            "p95 s",
            "max s",
            "load at end",
        ],
        rows,
    )
    lines += ["", f"Wall time: {(time.time() - started) / 60:.1f} min."]
    path = args.out_dir / ("load_quick.png" if args.quick else "load.png")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    plot(results, path)
    lines += ["", f"![{path.stem}]({path.name})"]
    common.write(args.out_dir / ("load_quick.md" if args.quick else "load.md"), lines)


if __name__ == "__main__":
    main()
