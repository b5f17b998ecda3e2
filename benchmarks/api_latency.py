"""HTTP API latency and throughput, measured through a real uvicorn server.

Measures, per server configuration (STT_WORKERS):
- end-to-end latency of one jfk (11 s) request, response_format=json (sequential, warm);
- time to the first SSE delta and to `transcript.text.done` (jfk and the 60 s clip);
- throughput with N concurrent clients, each sending jfk requests back to back.

    .venv/bin/python -m benchmarks.api_latency --model tiny.en --workers 1,2 \
        --out benchmarks/results/api_latency.md

With --url, an already running server is measured instead (its settings are whatever it was
started with).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

from benchmarks.common import EARNINGS as LONG
from benchmarks.common import JFK, REPO
from benchmarks.server import start_server


def transcribe(client: httpx.Client, url: str, audio: bytes, model: str) -> float:
    """One json request; returns seconds from send to full response."""
    t0 = time.perf_counter()
    r = client.post(
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", audio, "audio/wav")},
        data={"model": model},
    )
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed


def stream(client: httpx.Client, url: str, audio: bytes, model: str) -> tuple[float, float, int]:
    """One stream=true request: (first delta s, done s, number of deltas)."""
    t0 = time.perf_counter()
    first = None
    deltas = 0
    with client.stream(
        "POST",
        url + "/v1/audio/transcriptions",
        files={"file": ("a.wav", audio, "audio/wav")},
        data={"model": model, "stream": "true"},
    ) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "transcript.text.delta":
                deltas += 1
                if first is None:
                    first = time.perf_counter() - t0
            elif event["type"] == "transcript.text.done":
                return first or 0.0, time.perf_counter() - t0, deltas
            else:
                raise RuntimeError(f"stream failed: {event}")
    raise RuntimeError("stream ended without transcript.text.done")


T = TypeVar("T")


def run_clients(
    clients: int,
    per_client: int,
    request: Callable[[httpx.Client], T],
    warm_up: Callable[[httpx.Client], object] | None = None,
    timeout_s: float = 900,
) -> tuple[list[T], list[str], float]:
    """`clients` threads, each with its own connection, call `request(client)` `per_client` times
    back to back; `warm_up(client)` first (not counted) and then a common start. Returns the
    results, the errors (httpx errors, as text) and the wall time (s) from the common start."""
    results: list[T] = []
    errors: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client_loop() -> None:
        with httpx.Client(timeout=timeout_s) as client:
            if warm_up is not None:
                warm_up(client)
            start.wait()
            for _ in range(per_client):
                try:
                    result = request(client)
                except httpx.HTTPError as e:
                    with lock:
                        errors.append(str(e))
                    continue
                with lock:
                    results.append(result)

    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return results, errors, time.perf_counter() - t0


def concurrent(url: str, audio: bytes, model: str, clients: int, per_client: int) -> dict:
    latencies, _, wall = run_clients(
        clients, per_client, lambda c: transcribe(c, url, audio, model), timeout_s=600
    )
    n = clients * per_client
    return {
        "clients": clients,
        "requests": n,
        "wall_s": wall,
        "req_per_s": n / wall,
        "mean_latency_s": statistics.mean(latencies),
        "max_latency_s": max(latencies),
    }


def measure(url: str, model: str, runs: int, clients: int, per_client: int) -> dict:
    jfk, long = JFK.read_bytes(), LONG.read_bytes()
    with httpx.Client(timeout=600) as c:
        transcribe(c, url, jfk, model)  # warm the connection and caches
        e2e = [transcribe(c, url, jfk, model) for _ in range(runs)]
        jfk_stream = [stream(c, url, jfk, model) for _ in range(runs)]
        long_stream = [stream(c, url, long, model) for _ in range(max(1, runs // 2))]
    sequential = concurrent(url, jfk, model, 1, clients * per_client)
    parallel = concurrent(url, jfk, model, clients, per_client)
    return {
        "e2e": e2e,
        "jfk_stream": jfk_stream,
        "long_stream": long_stream,
        "sequential": sequential,
        "parallel": parallel,
    }


def med(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}"


def report(results: dict[str, dict], args: argparse.Namespace) -> str:
    lines = [
        "# HTTP API latency and throughput",
        "",
        f"`{' '.join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M')}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; model {args.model}, EP {args.ep}, STT_THREADS={args.threads}; "
        f"{args.runs} runs per figure (medians), loopback HTTP. Decoding: server defaults "
        "(timestamps, temperature fallback); beam 5 for plain requests, greedy for stream=true "
        "(the API's streaming default).",
        "",
        "Audio: jfk.wav (11.0 s) and earnings22_1_4482311_3_62.wav (59.6 s). Load average "
        f"(1 min) before / after: {args.load_before:.2f} / {os.getloadavg()[0]:.2f} "
        "(other processes on the machine compete for the cores when this is above ~0.5).",
        "",
        "| STT_WORKERS | jfk end-to-end (s) | jfk first delta (s) | jfk done (s) "
        "| 60 s first delta (s) | 60 s done (s) | deltas (60 s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        lines.append(
            f"| {name} | {med(r['e2e'])} (min {min(r['e2e']):.3f}) "
            f"| {med([s[0] for s in r['jfk_stream']])} | {med([s[1] for s in r['jfk_stream']])} "
            f"| {med([s[0] for s in r['long_stream']])} | {med([s[1] for s in r['long_stream']])} "
            f"| {r['long_stream'][0][2]} |"
        )
    lines += [
        "",
        f"Throughput, jfk requests: 1 client sequentially vs {args.clients} concurrent clients "
        f"({args.clients * args.per_client} requests each way).",
        "",
        "| STT_WORKERS | clients | wall (s) | requests/s | audio s per s | mean latency (s) "
        "| max latency (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        for key in ("sequential", "parallel"):
            t = r[key]
            lines.append(
                f"| {name} | {t['clients']} | {t['wall_s']:.2f} | {t['req_per_s']:.2f} "
                f"| {t['req_per_s'] * 11.0:.1f} | {t['mean_latency_s']:.2f} "
                f"| {t['max_latency_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="measure this running server instead of starting one")
    parser.add_argument("--model", default="tiny.en")
    parser.add_argument("--models-dir", type=Path, default=REPO / "models")
    parser.add_argument("--workers", default="1", help="comma list of STT_WORKERS to compare")
    parser.add_argument("--threads", type=int, default=0, help="STT_THREADS (0 = auto)")
    parser.add_argument("--ep", default="openvino", choices=["openvino", "cpu"])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--per-client", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    args = parser.parse_args()

    args.load_before = os.getloadavg()[0]
    results: dict[str, dict] = {}
    if args.url:
        results["(external)"] = measure(
            args.url.rstrip("/"), args.model, args.runs, args.clients, args.per_client
        )
    else:
        for workers in (int(w) for w in args.workers.split(",")):
            server = start_server(args.model, args.models_dir, workers, args.threads, args.ep)
            try:
                results[str(workers)] = measure(
                    server.url, args.model, args.runs, args.clients, args.per_client
                )
            finally:
                server.stop()
    text = report(results, args)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
