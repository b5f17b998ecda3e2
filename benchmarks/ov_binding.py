"""One decoder step inside OpenVINO, its inputs handed three ways: all fed per call (numpy
copied in), every tensor set once (numpy memory shared), or the window's cross K/V set once and
the rest fed per call (what a decode loop could do: the cross K/V change once per window).

Compare with the same step through ONNX Runtime's OpenVINO EP (`decoder_state.py`): the
difference is what the EP's per-call handling of the inputs costs. Needs the `openvino`
package, which is not installed beside onnxruntime-openvino: run it from a venv of its own.

    python -m venv /tmp/ovenv && /tmp/ovenv/bin/pip install openvino==2025.4.1 numpy
    /tmp/ovenv/bin/python benchmarks/ov_binding.py --model-dir models/tiny.en
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.step_profile import step_inputs  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, action="append", required=True)
    p.add_argument("--past", type=int, default=100, help="positions already decoded")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="f32", help="INFERENCE_PRECISION_HINT")
    p.add_argument("--calls", type=int, default=60, help="timed calls per way and round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (best median kept)")
    return p.parse_args()


def median_ms(call: Callable[[], object], calls: int) -> float:
    for _ in range(5):
        call()
    walls = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        walls.append(1000 * (time.perf_counter() - started))
    return statistics.median(walls)


def main() -> None:
    args = parse_args()
    try:
        import openvino as ov
    except ImportError:
        sys.exit("this script needs the openvino package (see its docstring)")
    core = ov.Core()
    config = {
        "INFERENCE_NUM_THREADS": args.threads,
        "INFERENCE_PRECISION_HINT": args.precision,
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
        "SNIPPETS_MODE": "DISABLE",
    }
    print(f"OpenVINO {ov.__version__}, {args.precision}, {args.threads} threads, one row, "
          f"past {args.past}, load {os.getloadavg()[0]:.2f}")  # fmt: skip
    print("| model | fed per call | all set once | cross K/V set once, rest fed |")
    print("|---|---|---|---|")
    for folder in args.model_dir:
        model = core.read_model(str(folder / "decoder.onnx"))
        compiled = core.compile_model(model, "CPU", config)
        feed = step_inputs(model, 1, args.past, shared=False)
        rest = {k: v for k, v in feed.items() if not k.startswith("cross_")}
        fed, bound, cross_bound = (compiled.create_infer_request() for _ in range(3))
        for name, array in feed.items():
            bound.set_tensor(name, ov.Tensor(array, shared_memory=True))
            if name.startswith("cross_"):
                cross_bound.set_tensor(name, ov.Tensor(array, shared_memory=True))
        ways = (partial(fed.infer, feed), bound.infer, partial(cross_bound.infer, rest))
        medians: list[list[float]] = [[] for _ in ways]
        for _ in range(args.rounds):  # the ways alternate
            for way, found in zip(ways, medians, strict=True):
                found.append(median_ms(way, args.calls))
        best = [min(found) for found in medians]
        print(f"| {folder.name} | " + " | ".join(f"{ms:.2f} ms" for ms in best) + " |")
    print(f"load at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
