"""Does binding a window's cross K/V once speed up a decoder step? numpy per call vs IOBinding.

A decoder step reads its window's cross K/V (f32: tiny.en 18 MB, base 37 MB, large-v3-turbo
61 MB). Two ways to hand them to ONNX Runtime's OpenVINO EP, one step (T = 1) after a past of
`--past` positions, rows on one window (as beams run):

  numpy   what the service does: every input a numpy array (`WhisperSessions.decode`);
  bound   the cross K/V made OrtValues and bound once (IOBinding, kept between steps); per call
          input_ids, position_ids, attention_mask and the past K/V are bound from numpy, the
          outputs to CPU memory ONNX Runtime allocates.

Both cases call the same session, alternating call by call; each figure is the median over
`--rounds` of the mean of `--steps` calls. Model folders: models/<name>, else a folder path.

    .venv/bin/python benchmarks/cross_binding.py --models base,/path/to/large-v3-turbo

Writes benchmarks/results/cross_binding.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402

ROWS = (1, 5)


class Step:
    """One model's session, one window's cross K/V, and both ways of running a step."""

    def __init__(self, folder: Path, threads: int, past: int, rows: int) -> None:
        import onnxruntime as ort

        from app.runtime import contract
        from app.runtime.sessions import RuntimeOptions, WhisperSessions

        self.s = WhisperSessions.load(folder, RuntimeOptions(threads=threads))
        d = self.s.manifest.dims
        rng = np.random.default_rng(0)
        self.cross = self.s.encode(rng.standard_normal((1, d.n_mels, 3000)).astype(np.float32))
        self.cross_mb = sum(a.nbytes for a in self.cross) / 2**20
        self.past_names = contract.past_names(d.n_text_layer)
        self.outputs = contract.decoder_step_output_names(d.n_text_layer)
        self.dec = self.s._decoder
        self.io = self.dec.io_binding()
        self.bound_cross = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.cross]
        names = contract.encoder_output_names(d.n_text_layer)
        for name, value in zip(names, self.bound_cross, strict=True):
            self.io.bind_ortvalue_input(name, value)
        self.set_rows(rows, past)

    def set_rows(self, rows: int, past: int) -> None:
        d = self.s.manifest.dims
        self.ids = np.full((rows, 1), 440, np.int64)
        self.pos = np.full((rows, 1), past, np.int64)
        self.mask = np.ones((rows, past + 1), np.int64)
        shape = (rows, d.n_heads, past, d.head_dim)
        self.past = [np.zeros(shape, np.float32) for _ in self.past_names]

    def numpy(self) -> np.ndarray:
        return self.s.decode(self.ids, self.pos, self.mask, self.past, self.cross)[0]

    def bound(self) -> np.ndarray:
        io = self.io
        io.bind_cpu_input("input_ids", self.ids)
        io.bind_cpu_input("position_ids", self.pos)
        io.bind_cpu_input("attention_mask", self.mask)
        for name, value in zip(self.past_names, self.past, strict=True):
            io.bind_cpu_input(name, value)
        for name in self.outputs:
            io.bind_output(name, "cpu")
        self.dec.run_with_iobinding(io)
        return io.get_outputs()[0].numpy()


def folder_of(name: str) -> Path:
    local = REPO / "models" / name
    return local if (local / "manifest.json").is_file() else Path(name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--past", type=int, default=100)
    p.add_argument("--steps", type=int, default=20, help="calls per case and round")
    p.add_argument("--rounds", type=int, default=7)
    common.add_args(p)
    args = p.parse_args()
    load_before = common.start_load(args)
    rows_out, loads = [], []
    for name in args.models.split(","):
        step = Step(folder_of(name), args.threads, args.past, ROWS[0])
        for rows in ROWS:
            step.set_rows(rows, args.past)
            same = np.array_equal(step.numpy(), step.bound())  # and a warm-up of each
            times: dict[str, list[float]] = {"numpy": [], "bound": []}
            before = common.load1()
            for r in range(args.rounds):
                for case in common.rotate(list(times), r):
                    call = getattr(step, case)
                    started = time.perf_counter()
                    for _ in range(args.steps):
                        call()
                    times[case].append(1e3 * (time.perf_counter() - started) / args.steps)
            loads.append((name, rows, before, common.load1()))
            ms = {case: statistics.median(v) for case, v in times.items()}
            rows_out.append(
                [
                    Path(name).name,
                    rows,
                    f"{step.cross_mb:.0f}",
                    f"{ms['numpy']:.2f}",
                    f"{ms['bound']:.2f}",
                    f"{ms['bound'] / ms['numpy']:.3f}",
                    "yes" if same else "no",
                ]
            )
            print(rows_out[-1], file=sys.stderr)
    head = ["model", "rows", "cross MB", "numpy ms", "bound ms", "bound ÷ numpy", "same logits"]
    lines = common.header(
        "Cross K/V handed per call (numpy) vs bound once (IOBinding)",
        load_before,
        [
            f"One decoder step, past {args.past}, rows on one window, OpenVINO EP on CPU, the "
            f"service's defaults, {args.threads} threads; median over {args.rounds} alternating "
            f"rounds of the mean of {args.steps} calls.",
        ],
    )
    lines += ["", *common.table(head, rows_out), ""]
    lines += [f"- {Path(n).name}, {r} row(s): load {a:.2f}–{b:.2f}" for n, r, a, b in loads]
    common.write(args.out_dir / "cross_binding.md", lines)


if __name__ == "__main__":
    main()
