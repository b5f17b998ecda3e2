"""One decoder step inside OpenVINO, its inputs handed four ways: all fed per call (numpy
copied in), every tensor set once (numpy memory shared), the window's cross K/V set once and
the rest fed per call (what a decode loop could do: the cross K/V change once per window), and
the same with the cross K/V as bf16 inputs (the model's cross inputs declared bf16 through
OpenVINO's pre-processing: what an encoder emitting bf16 K/V would hand over; on a CPU that
computes bf16 the per-call f32 -> bf16 reorder of the cross K/V is gone).

This study (2026-11-30) led the service from ONNX Runtime's OpenVINO EP to OpenVINO's own API
(`app.runtime.graphs`), which binds per call as the third and fourth ways do.

    .venv/bin/python benchmarks/ov_binding.py --model-dir models/tiny.en --precision bf16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import common  # noqa: E402
from benchmarks.step_profile import cpu_config, import_openvino, step_inputs  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, action="append", required=True)
    p.add_argument("--past", type=int, default=100, help="positions already decoded")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="f32", help="INFERENCE_PRECISION_HINT")
    p.add_argument("--calls", type=int, default=60, help="timed calls per way and round")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (best median kept)")
    p.add_argument("--out", type=Path, help="also write the Markdown here")
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


def bf16_cross_request(ov, core, folder: Path, config: dict, feed: dict):
    """An infer request of `decoder.onnx` whose cross K/V inputs are bf16 tensors, set once
    (the f32 values of `feed` rounded to bf16)."""
    from openvino.preprocess import PrePostProcessor

    model = core.read_model(str(folder / "decoder.onnx"))
    ppp = PrePostProcessor(model)
    cross = [name for name in feed if name.startswith("cross_")]
    for name in cross:
        ppp.input(name).tensor().set_element_type(ov.Type.bf16)
    request = core.compile_model(ppp.build(), "CPU", config).create_infer_request()
    for name in cross:
        bits = feed[name].view(np.uint32) >> 16  # truncated to bf16
        tensor = ov.Tensor(ov.Type.bf16, list(feed[name].shape))
        tensor.data.view(np.uint16)[...] = bits.astype(np.uint16)
        request.set_tensor(name, tensor)
    return request


def main() -> None:
    args = parse_args()
    ov = import_openvino()
    load_before = common.load1()
    core = ov.Core()
    config = cpu_config(args.threads, args.precision, activation_groups=0)
    rows = []
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
        bf16_bound = bf16_cross_request(ov, core, folder, config, feed)
        ways = (
            partial(fed.infer, feed),
            bound.infer,
            partial(cross_bound.infer, rest),
            partial(bf16_bound.infer, rest),
        )
        medians: list[list[float]] = [[] for _ in ways]
        for _ in range(args.rounds):  # the ways alternate
            for way, found in zip(ways, medians, strict=True):
                found.append(median_ms(way, args.calls))
        rows.append([folder.name, *(f"{min(found):.2f} ms" for found in medians)])
    setting = (f"OpenVINO {ov.__version__}, {args.precision}, {args.threads} threads, one row, "
               f"past {args.past}; medians of {args.calls} calls, best of {args.rounds} "
               "alternating rounds.")  # fmt: skip
    head = [
        "model",
        "fed per call",
        "all set once",
        "cross K/V set once, rest fed",
        "bf16 cross K/V set once, rest fed",
    ]
    lines = [
        *common.header("One decoder step inside OpenVINO", load_before, [setting]),
        "",
        *common.table(head, rows),
    ]
    if args.out:
        common.write(args.out, lines)
    else:
        print("\n".join(lines))


if __name__ == "__main__":
    main()
