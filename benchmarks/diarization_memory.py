"""What the speaker models add to the server's RSS (issue 33: at most 150 MB).

A real server (`uvicorn --factory app.main:create_app`, STT_MODELS=<model>, the glibc malloc
settings of `make run`, otherwise the service's defaults unless `--set` changes them) transcribes
the 60 s earnings clip with word timing (`verbose_json`, `timestamp_granularities[]=word`: the
aligner diarization needs is then loaded too) `--rounds` times: that RSS is the baseline. Then
the same clip as `diarized_json` `--rounds` times (the speaker models load on the first one).
Added = RSS after the diarized rounds - baseline; the peak (VmHWM) is reported too.

    .venv/bin/python -m benchmarks.diarization_memory
    .venv/bin/python -m benchmarks.diarization_memory --set STT_DIARIZATION_DEVICE=CPU

Writes benchmarks/results/diarization_memory.md (one row per run is appended: each run names
its settings).
"""

from __future__ import annotations

import argparse
import time

import httpx

from app.runtime.memory import malloc_environment
from benchmarks import common
from benchmarks.common import REPO
from benchmarks.server import launch_server

RESULTS = REPO / "benchmarks" / "results" / "diarization_memory.md"
HEAD = (
    "date", "settings", "load 1 min (start / end)", "RSS loaded MB", "RSS transcribed MB",
    "RSS diarized MB", "added MB", "peak MB", "diarized s",
)  # fmt: skip


def post(client: httpx.Client, url: str, audio: bytes, data: dict[str, object]) -> float:
    started = time.perf_counter()
    r = client.post(url + "/v1/audio/transcriptions", files={"file": ("a.wav", audio)}, data=data)
    r.raise_for_status()
    return time.perf_counter() - started


def measure(model: str, settings: dict[str, str], rounds: int) -> dict[str, float]:
    server = launch_server(model, REPO / "models", {**malloc_environment(), **settings})
    audio = common.EARNINGS.read_bytes()
    try:
        assert server.process is not None
        pid = server.process.pid
        found = {"loaded": common.rss_mb(pid)[0]}
        with httpx.Client(timeout=900) as client:
            words = {"response_format": "verbose_json", "timestamp_granularities[]": "word"}
            for _ in range(rounds):
                post(client, server.url, audio, words)
            found["transcribed"] = common.rss_mb(pid)[0]
            times = [
                post(client, server.url, audio, {"response_format": "diarized_json"})
                for _ in range(rounds)
            ]
            found["diarized"], found["peak"] = common.rss_mb(pid)
            found["seconds"] = min(times)
    finally:
        server.stop()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_args(parser)
    parser.add_argument("--model", default="base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--set", action="append", default=[], help="STT_X=value (repeatable)")
    parser.add_argument("--note", default="", help="what this run measures (in its row)")
    args = parser.parse_args()
    settings = dict(item.split("=", 1) for item in args.set)
    load = common.start_load(args)
    found = measure(args.model, settings, args.rounds)
    parts = [*(f"{k}={v}" for k, v in settings.items()), *([args.note] if args.note else [])]
    named = ", ".join(parts) or "defaults"
    row = [
        time.strftime("%Y-%m-%d %H:%M"), f"{args.model}, {named}",
        f"{load:.2f} / {common.load1():.2f}", f"{found['loaded']:.0f}",
        f"{found['transcribed']:.0f}", f"{found['diarized']:.0f}",
        f"{found['diarized'] - found['transcribed']:.0f}", f"{found['peak']:.0f}",
        f"{found['seconds']:.1f}",
    ]  # fmt: skip
    print(" | ".join(row))
    if not RESULTS.exists():
        what = __doc__.split("\n\n")[1].replace("\n", " ")
        lines = common.header("Speaker models: RSS they add to the server", load, [what])
        common.write(RESULTS, [*lines, "", *common.table(HEAD, [])])
    with RESULTS.open("a") as out:
        out.write("| " + " | ".join(row) + " |\n")


if __name__ == "__main__":
    main()
