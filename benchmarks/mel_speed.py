"""Log-mel speed: ours (`app.engine.mel`) vs faster-whisper's feature extractor, in one process.

Each system is called as its transcription does: ours with 30 s of silence appended
(`padding=N_SAMPLES_PER_WINDOW`, as `app/service/transcription/transcriber.py`), faster-whisper's
`FeatureExtractor` with its default `padding=160`. faster-whisper's module is loaded from the
peer environment's file (`.venv-peer/.../faster_whisper/feature_extractor.py`, numpy only), so
its own code runs on this environment's numpy. `--before REV` adds ours as of a git revision
(its app/engine/mel.py, loaded from `git show`). Clips: the 60 s earnings clip and the ~10 min
clip (benchmarks/common.py). Every round calls each system once per clip, in an order rotating
between rounds; figures are medians (and minima) over the rounds. Threads: numpy's defaults.

    .venv/bin/python -m benchmarks.mel_speed --before 10cc211 --runs 9

Writes benchmarks/results/mel_speed.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from app.engine.audio import decode_audio
from app.engine.mel import log_mel_spectrogram
from app.runtime.contract import N_SAMPLES_PER_WINDOW
from benchmarks import common
from benchmarks.common import REPO

PEER_EXTRACTOR = "lib/python3.11/site-packages/faster_whisper/feature_extractor.py"


def load_module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ours_at(revision: str, scratch: Path) -> Callable[[np.ndarray], np.ndarray]:
    """Our log-mel as of a git revision, called as the transcriber calls it."""
    source = subprocess.run(
        ["git", "show", f"{revision}:app/engine/mel.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = scratch / f"mel_{revision}.py"
    path.write_text(source)
    module = load_module(f"mel_{revision}", path)
    return lambda audio: module.log_mel_spectrogram(audio, 80, padding=N_SAMPLES_PER_WINDOW)


def systems(before: str | None, scratch: Path) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    peer = load_module("fw_feature_extractor", common.PEER_PYTHON.parents[1] / PEER_EXTRACTOR)
    extractor = peer.FeatureExtractor(feature_size=80)
    found: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "ours": lambda audio: log_mel_spectrogram(audio, 80, padding=N_SAMPLES_PER_WINDOW),
        "faster-whisper": extractor,
    }
    if before:
        found[f"ours at {before}"] = ours_at(before, scratch)
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=9, help="rounds (default 9)")
    p.add_argument("--before", help="also time ours as of this git revision")
    common.add_args(p)
    args = p.parse_args()
    load_before = common.start_load(args)
    clips = {
        "60 s": decode_audio(common.EARNINGS),
        "10 min": decode_audio(common.long_clip()),
    }
    with tempfile.TemporaryDirectory() as scratch:
        runners = systems(args.before, Path(scratch))
        times: dict[tuple[str, str], list[float]] = {}
        loads = [common.load1()]
        for audio in clips.values():  # warm-up: plans, caches, BLAS threads
            for run in runners.values():
                run(audio)
        for r in range(args.runs):
            for clip, audio in clips.items():
                for name in common.rotate(list(runners), r):
                    started = time.perf_counter()
                    runners[name](audio)
                    times.setdefault((clip, name), []).append(time.perf_counter() - started)
            loads.append(common.load1())
    rows = []
    for clip in clips:
        reference = statistics.median(times[(clip, "faster-whisper")])
        for name in runners:
            samples = times[(clip, name)]
            median = statistics.median(samples)
            rows.append(
                [
                    clip,
                    name,
                    f"{1e3 * median:.1f}",
                    f"{1e3 * min(samples):.1f}",
                    f"{median / reference:.2f}×",
                ]
            )
    lines = common.header(
        "Log-mel speed: ours vs faster-whisper's feature extractor",
        load_before,
        [
            f"{args.runs} rounds, alternated; 1-min load average after each round: "
            + ", ".join(f"{x:.2f}" for x in loads)
            + f"; numpy {np.__version__}. Ours appends 30 s of silence (the transcriber's call), "
            "faster-whisper 160 samples (its default).",
        ],
    )
    head = ["clip", "system", "median ms", "min ms", "vs faster-whisper"]
    lines += ["", *common.table(head, rows)]
    common.write(args.out_dir / "mel_speed.md", lines)


if __name__ == "__main__":
    main()
