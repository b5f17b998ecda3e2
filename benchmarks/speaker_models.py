"""Speaker models' speed per call: segmentation per 10 s window, CAM++ embedding per clip length.

Both graphs (`models/diarization/`, `make speaker-models`) on ONNX Runtime's CPU EP and on the
OpenVINO EP (CPU device), each with `--threads` intra-op threads: segmentation of the 60 s
earnings clip in windows every 5 s, 1 or 4 windows per call; the embedding (fbank included) of
3 s and 10 s of it. Figures are medians (and minima) over `--runs` rounds after one warm-up.
RSS: what loading each EP's two sessions added to the process, then what stayed after its runs
(the OpenVINO EP is measured after the CPU one, in the same process; start it with the
glibc settings of `make run` to see what the server sees).

    .venv/bin/python -m benchmarks.speaker_models --runs 5

Writes benchmarks/results/speaker_models.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

from app.engine.audio import decode_audio
from app.engine.speakers import load_speaker_models
from app.runtime.contract import SAMPLE_RATE
from app.runtime.placement import RuntimeOptions
from benchmarks import common
from benchmarks.common import REPO

CLIP = REPO / "tests" / "data" / "audio" / "earnings22_1_4482311_3_62.wav"
STEP_S = 5.0


def timed(call: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median, minimum) seconds of `runs` calls after one warm-up."""
    call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common.add_args(parser)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    load = common.start_load(args)
    audio = decode_audio(CLIP)
    rows, memory = [], []
    for ep in ("cpu", "openvino"):
        options = RuntimeOptions(ep=ep, device="CPU", threads=args.threads)
        before = common.rss_mb(os.getpid())[0]
        models = load_speaker_models(REPO / "models", options)
        loaded = common.rss_mb(os.getpid())[0]
        for batch in (1, 4):
            segmentation = models.segmentation.with_options(step_s=STEP_S, batch=batch)
            windows = len(segmentation.window_starts(len(audio)))
            median, best = timed(lambda s=segmentation: s(audio), args.runs)
            rows.append(
                (
                    ep,
                    f"segmentation, {batch} window(s) per call",
                    "per 10 s window",
                    f"{median / windows * 1000:.0f}",
                    f"{best / windows * 1000:.0f}",
                )
            )
        for seconds in (3, 10):
            piece = audio[: seconds * SAMPLE_RATE]
            median, best = timed(lambda p=piece, e=models.embedding: e(p), args.runs)
            rows.append(
                (
                    ep,
                    "embedding (fbank + CAM++)",
                    f"{seconds} s clip",
                    f"{median * 1000:.0f}",
                    f"{best * 1000:.0f}",
                )
            )
        after = common.rss_mb(os.getpid())[0]
        memory.append((ep, f"{loaded - before:.0f}", f"{after - before:.0f}"))
    lines = common.header("Speaker models: time per call", load)
    lines += ["", *common.table(("EP", "what", "unit", "median ms", "min ms"), rows)]
    lines += [
        "",
        *common.table(("EP", "RSS added by loading, MB", "RSS kept after the runs, MB"), memory),
    ]
    common.write(args.out_dir / "speaker_models.md", lines)


if __name__ == "__main__":
    main()
