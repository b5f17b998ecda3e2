"""A window's encoder call through the batching scheduler: outputs copied into a slab slot, or
written there by the encoder.

The batching scheduler keeps each window's cross K/V in a slot of its slab (tiny.en 18 MB,
base 37 MB, large-v3-turbo 61 MB in f32). Two ways to get them there, one window at a time as a
live stream's passes or a file's windows come, the slot freed (its pages handed back to the
system) before the next window as a finished window's are:

  copy    `WhisperSessions.encode` (ONNX Runtime allocates the outputs; its arena is off, so each
          call's outputs are fresh pages) then `CrossSlab.store` copies them into the slot
  direct  `CrossSlab.write` with `WhisperSessions.encode_into` (IOBinding: the encoder writes
          into the slot), what the scheduler does since this benchmark was written

Both alternate call by call on one session and the same features (a real window of speech);
the figures are medians over `--rounds` of the wall time and the minor page faults of one call.

    .venv/bin/python benchmarks/slab_encode.py --models tiny.en,base

Writes benchmarks/results/slab_encode.md.
"""

from __future__ import annotations

import argparse
import gc
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402


class Window:
    """One model's session, one window's features, a slab, and both ways into a slot."""

    def __init__(self, folder: Path, threads: int) -> None:
        from app.engine.audio import decode_audio
        from app.engine.mel import log_mel_spectrogram, pad_or_trim
        from app.runtime.contract import N_SAMPLES_PER_WINDOW
        from app.runtime.sessions import RuntimeOptions, WhisperSessions
        from app.service.cross_slab import CrossSlab

        self.sessions = WhisperSessions.load(folder, RuntimeOptions(threads=threads))
        audio = decode_audio(common.AUDIO / "earnings22_1_4482311_3_62.wav")
        mel = log_mel_spectrogram(
            audio[:N_SAMPLES_PER_WINDOW], self.sessions.manifest.dims.n_mels, N_SAMPLES_PER_WINDOW
        )
        self.features = np.ascontiguousarray(pad_or_trim(mel)[None])
        reference = self.sessions.encode(self.features)
        self.cross_mb = sum(a.nbytes for a in reference) / 2**20
        self.slab = CrossSlab(reference, slots=4)

    def copy(self) -> list[np.ndarray]:
        held = self.slab.store(self.sessions.encode(self.features), 0)
        assert held is not None
        return held

    def direct(self) -> list[np.ndarray]:
        held = self.slab.write([self.features], self.sessions.encode_into)
        assert held is not None
        return held[0]


def folder_of(name: str) -> Path:
    """models/<name> when it is built there, else `name` as a path."""
    local = REPO / "models" / name
    return local if (local / "manifest.json").is_file() else Path(name)


def main() -> None:
    from app.runtime.memory import tune_malloc

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--rounds", type=int, default=12)
    common.add_args(p)
    args = p.parse_args()
    tune_malloc()  # as the server runs
    load_before = common.start_load(args)
    rows_out, loads = [], []
    for name in args.models.split(","):
        window = Window(folder_of(name), args.threads)
        cases = {"copy": window.copy, "direct": window.direct}
        pairs = zip(window.copy(), window.direct(), strict=True)  # and a warm-up of each
        same = all(np.array_equal(a, b) for a, b in pairs)
        gc.collect()
        ms: dict[str, list[float]] = {c: [] for c in cases}
        faults: dict[str, list[int]] = {c: [] for c in cases}
        before = common.load1()
        for r in range(args.rounds):
            for case in common.rotate(list(cases), r):
                f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                started = time.perf_counter()
                held = cases[case]()
                ms[case].append(1e3 * (time.perf_counter() - started))
                faults[case].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
                del held  # the window is done: its slot frees and its pages go back
                gc.collect()
        loads.append((name, before, common.load1()))
        med = {c: statistics.median(v) for c, v in ms.items()}
        row = [
            name,
            f"{window.cross_mb:.0f}",
            f"{med['copy']:.1f}",
            f"{med['direct']:.1f}",
            f"{med['direct'] - med['copy']:+.1f}",
            f"{statistics.median(faults['copy']):.0f}",
            f"{statistics.median(faults['direct']):.0f}",
            "yes" if same else "no",
        ]
        rows_out.append(row)
        print(row, file=sys.stderr)
    head = ["model", "cross MB", "copy ms", "direct ms", "direct - copy", "copy faults",
            "direct faults", "same K/V"]  # fmt: skip
    lines = common.header(
        "A window's encoder call into a slab slot: copied in vs written by the encoder",
        load_before,
        [
            f"One 30 s window of speech, OpenVINO EP on CPU, the service's defaults and malloc "
            f"settings, {args.threads} threads; medians over {args.rounds} alternating rounds of "
            "one call's wall time and minor page faults; the slot is freed between calls.",
        ],
    )
    lines += ["", *common.table(head, rows_out), ""]
    lines += [f"- {n}: load {a:.2f}-{b:.2f}" for n, a, b in loads]
    common.write(args.out_dir / "slab_encode.md", lines)


if __name__ == "__main__":
    main()
