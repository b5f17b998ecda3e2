"""The int8-input layers on each CPU kind: right or wrong, and how fast, each way they can run.

For each kind this machine can be held to (`ONEDNN_MAX_CPU_ISA`, one child process per kind:
OpenVINO reads it once), and each way of running the int8 files' int8-input layers:
  int8   OpenVINO's int8 kernels (int8 x int8; on a kind without int8 dot products the u8 x s8
         pair sums saturate in int16)
  float  the same layers in float on their int8 grids (`graphs.FLOAT_INT8_INPUTS`: what the
         service runs where the kind has no int8 dot products)
it reports the worst error of the model's int8 layers against their integer results (the
check of `tests/engine/test_int8_layers_per_cpu_kind.py`), the encoder's time per 30 s window
and a decoder step's (one row, 100 tokens of past), medians; the service's precision for the
kind (bf16 where it has native bf16, else f32). Times on a held CPU are the held kernels on this
CPU's cores, not a real CPU of that kind.

    .venv/bin/python -m benchmarks.cpu_kinds --out benchmarks/results/cpu_kinds_speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import MODELS_DIR, header, load1, table, write

KINDS = ("", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI", "AVX512_CORE_BF16")
WAYS = ("int8", "float")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    p.add_argument("--kinds", default=",".join(k or "native" for k in KINDS))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", nargs=2, metavar=("MODEL", "WAY"), help=argparse.SUPPRESS)
    return p.parse_args()


def child(args: argparse.Namespace) -> None:
    """In a process held to one kind: {"kind", "precision", "error", "encoder_ms", "step_ms"}."""
    import numpy as np
    import onnx

    from app.runtime import graphs, placement
    from app.runtime.cpu_kind import this_cpu
    from app.runtime.placement import RuntimeOptions
    from app.runtime.sessions import WhisperSessions
    from tests.engine.test_int8_layers_per_cpu_kind import ROWS, int8_layers

    model, way = args.child
    kind = this_cpu()
    chosen = graphs.FLOAT_INT8_INPUTS if way == "float" else {}
    placement.int8_input_properties = lambda kind=None: dict(chosen)  # the way asked for
    folder = MODELS_DIR / model
    worst, rng = 0.0, np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for stage in ("encoder", "decoder"):
            for i, layer in enumerate(int8_layers(folder / f"{stage}.onnx")):
                path = Path(tmp) / f"{stage}{i}.onnx"
                onnx.save(layer.model(), path)
                graph = placement.open_graph(path, "openvino", "CPU", 1, inference_precision="f32")
                shape = (ROWS, layer.inputs)
                x = (rng.integers(-140, 141, shape) + rng.uniform(-0.4, 0.4, shape)) * layer.step
                (y,) = graph.run([layer.y], {layer.x: x.astype(np.float32)})
                expected = layer.integer_result(x)
                worst = max(worst, float(np.abs(y - expected).max() / np.abs(expected).max()))
    options = RuntimeOptions(device="CPU", threads=args.threads, inference_precision="auto")
    loaded = WhisperSessions.load(folder, options)
    features = rng.standard_normal((1, loaded.manifest.dims.n_mels, 3000)).astype(np.float32)
    cross = loaded.encode(features)
    encoder = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        loaded.encode(features)
        encoder.append(time.perf_counter() - started)
    past = [np.zeros((1, p.shape[1], 100, p.shape[3]), loaded.kv_dtype) for p in cross]
    feed = (np.array([[440]]), np.array([[100]]), np.ones((1, 101), np.int64))
    steps = []
    for _ in range(20 * args.repeats):
        started = time.perf_counter()
        loaded.decode(*feed, past, cross)
        steps.append(time.perf_counter() - started)
    print(
        json.dumps(
            {
                "kind": kind.name,
                "arithmetic": loaded.arithmetic["encoder"],
                "error": worst,
                "encoder_ms": 1000 * statistics.median(encoder),
                "step_ms": 1000 * statistics.median(steps),
            }
        )
    )


def run_child(model: str, way: str, kind: str, args: argparse.Namespace) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    if kind:
        env["ONEDNN_MAX_CPU_ISA"] = kind
    command = [sys.executable, __file__, "--child", model, way]
    command += ["--repeats", str(args.repeats), "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    args = parse_args()
    if args.child:
        return child(args)
    load_before = load1()
    kinds = ["" if k == "native" else k for k in args.kinds.split(",")]
    rows = []
    for model in args.models.split(","):
        for kind in kinds:
            results = {way: run_child(model, way, kind, args) for way in WAYS}
            for way, r in results.items():
                rows.append(
                    [
                        model,
                        r["kind"],
                        way,
                        f"{100 * r['error']:.2g} %",
                        f"{r['encoder_ms']:.0f}",
                        f"{r['step_ms']:.2f}",
                    ]
                )
                print(" | ".join(rows[-1]), flush=True)
    lines = header("int8-input layers per CPU kind (held by ONEDNN_MAX_CPU_ISA)", load_before)
    lines += table(
        ["model", "kind", "int8 layers run", "worst layer error", "encoder ms", "step ms"], rows
    )
    if args.out:
        write(args.out, lines)


if __name__ == "__main__":
    main()
