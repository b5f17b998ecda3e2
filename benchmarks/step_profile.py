"""Where a decoder step's time goes inside OpenVINO: per-operation time for R rows per call.

This script compiles `decoder.onnx` with the `openvino` package (the runtime the service uses,
with the configuration `app.runtime.sessions` passes: bf16 where the CPU has it;
activation quantization per `--activation-groups`, default off) and reads OpenVINO's per-node
performance counters. Inputs are one step (T = 1) after a past of `--past` positions; every row
has its own 30 s window ("distinct", as the batching scheduler runs them) or all rows share one
("shared", beams).

    python -m benchmarks.step_profile --model-dir models/tiny.en --rows 1,8

Prints, per row count and window mode, the summed time of each (operation type, kernel) over the
call, the sum over all nodes and the number of nodes; writes the same as Markdown with --out.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

TOP = 8  # operation types listed per configuration


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True, help="a built model folder")
    p.add_argument("--rows", default="1,8", help="rows per call")
    p.add_argument("--past", type=int, default=100, help="positions already decoded")
    p.add_argument("--precision", default="bf16", help="INFERENCE_PRECISION_HINT (bf16, f32)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--activation-groups",
        type=int,
        default=0,
        help="DYNAMIC_QUANTIZATION_GROUP_SIZE (0 = activations not quantized; the service uses "
        "32 where the CPU computes f32)",
    )
    p.add_argument("--calls", type=int, default=20, help="profiled calls per configuration")
    p.add_argument("--out", type=Path, help="also write a Markdown table here")
    return p.parse_args()


def import_openvino() -> ModuleType:
    """The `openvino` package, or exit saying how to get it."""
    try:
        import openvino
    except ImportError:
        sys.exit("this script needs the openvino package: pip install openvino==2025.4.1")
    return openvino


def cpu_config(threads: int, precision: str, activation_groups: int) -> dict[str, object]:
    """OpenVINO's CPU settings for compiling `decoder.onnx` as the service does, but with its
    f32 inputs (the service declares K/V bf16 where it computes bf16)."""
    return {
        "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": precision,
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(activation_groups),
        # OpenVINO 2025.4's attention snippet rejects f32 inputs meeting bf16 activations
        "SNIPPETS_MODE": "DISABLE",
    }


def step_inputs(model, rows: int, past: int, shared: bool) -> dict[str, np.ndarray]:
    """Random inputs of one decoder step with `rows` rows after `past` positions."""
    rng = np.random.default_rng(0)
    feed: dict[str, np.ndarray] = {}
    for port in model.inputs:
        name, shape = port.get_any_name(), port.get_partial_shape()
        if name == "input_ids":
            feed[name] = np.full((rows, 1), 440, np.int64)
        elif name == "position_ids":
            feed[name] = np.full((rows, 1), past, np.int64)
        elif name == "attention_mask":
            feed[name] = np.ones((rows, past + 1), np.int64)
        elif name == "logits_at":
            feed[name] = np.zeros(1, np.int64)
        elif name.startswith("past_"):
            heads, head_dim = shape[1].get_length(), shape[3].get_length()
            feed[name] = rng.standard_normal((rows, heads, past, head_dim), np.float32)
        else:  # cross_k_i / cross_v_i
            heads, head_dim = shape[1].get_length(), shape[3].get_length()
            windows = 1 if shared else rows
            feed[name] = rng.standard_normal((windows, heads, 1500, head_dim), np.float32)
    return feed


def profile(compiled, feed: dict[str, np.ndarray], calls: int) -> tuple[dict, float]:
    """Mean ms per call of each (type, kernel) over `calls` calls, and the median wall ms."""
    request = compiled.create_infer_request()
    for _ in range(5):
        request.infer(feed)
    totals: collections.Counter = collections.Counter()
    walls = []
    for _ in range(calls):
        started = time.perf_counter()
        request.infer(feed)
        walls.append(1000 * (time.perf_counter() - started))
        for node in request.profiling_info:
            totals[(node.node_type, node.exec_type)] += node.real_time.total_seconds() * 1000
    return {k: v / calls for k, v in totals.items()}, statistics.median(walls)


def main() -> None:
    args = parse_args()
    ov = import_openvino()
    core = ov.Core()
    model = core.read_model(str(args.model_dir / "decoder.onnx"))
    config = cpu_config(args.threads, args.precision, args.activation_groups)
    compiled = core.compile_model(model, "CPU", {"PERF_COUNT": "YES", **config})
    manifest = json.loads((args.model_dir / "manifest.json").read_text())
    lines = [
        f"# Decoder step profile: {manifest['name']} ({manifest.get('precision', '?')} files), "
        f"OpenVINO {ov.__version__}, {args.precision}, {args.threads} threads, past {args.past}, "
        f"activation groups {args.activation_groups}",
        "",
        "| rows | windows | op type | kernel | ms per call | share |",
        "|---|---|---|---|---|---|",
    ]
    for rows in [int(r) for r in args.rows.split(",")]:
        for shared in (False, True) if rows > 1 else (False,):
            mode = "shared" if shared else "distinct"
            times, wall = profile(compiled, step_inputs(model, rows, args.past, shared), args.calls)
            total = sum(times.values())
            print(f"rows {rows} {mode}: nodes {total:.2f} ms (wall with counters {wall:.2f} ms)")
            for (op_type, kernel), ms in sorted(times.items(), key=lambda kv: -kv[1])[:TOP]:
                print(f"  {ms:7.3f} ms  {op_type:28s} {kernel}")
                lines.append(
                    f"| {rows} | {mode} | {op_type} | {kernel} | {ms:.2f} | {ms / total:.0%} |"
                )
            lines.append(f"| {rows} | {mode} | **all nodes** | | **{total:.2f}** | 100% |")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
