"""Would a window's cross K/V read at 8 bits make a decoder step cheaper? One step's
cross-attention over every layer (query [1, H, 1, Dh] against K/V [1, H, 1500, Dh]) compiled by
OpenVINO's CPU plugin in bf16, with K/V handed over as bf16 (as the service does) or as int8 with
a scale per head and position, dequantized in the graph (Convert, Multiply) before the products.

    python -m benchmarks.cross_attention_int8 --heads 6 --layers 4    # tiny
    python -m benchmarks.cross_attention_int8 --heads 8 --layers 6    # base

Prints the median wall ms per call of each. Snippets are off for both (OpenVINO 2025.4's
attention snippet refuses this small graph's f32 query against bf16 K/V); the service's decoder
step is as fast with them off (`results/genai_cpu.md`).
"""

from __future__ import annotations

import argparse
import statistics
import time

import ml_dtypes
import numpy as np
import openvino as ov
import openvino.opset13 as ops
from openvino.preprocess import PrePostProcessor

POSITIONS = 1500  # a 30 s window's encoder positions
HEAD_DIM = 64


def build(heads: int, layers: int, int8: bool) -> ov.Model:
    """The cross-attention of `layers` layers for one new token."""
    shape = [1, heads, POSITIONS, HEAD_DIM]
    query = ops.parameter([1, heads, 1, HEAD_DIM], np.float32, name="q")
    params, outs = [query], []
    scaled = ops.multiply(query, np.float32(HEAD_DIM**-0.5))
    for layer in range(layers):
        kv = []
        for name in ("k", "v"):
            if int8:
                values = ops.parameter(shape, np.int8, name=f"{name}{layer}")
                scale = ops.parameter([1, heads, POSITIONS, 1], np.float32, name=f"{name}s{layer}")
                params += [values, scale]
                kv.append(ops.multiply(ops.convert(values, np.float32), scale))
            else:
                values = ops.parameter(shape, np.float32, name=f"{name}{layer}")
                params.append(values)
                kv.append(values)
        weights = ops.softmax(ops.matmul(scaled, kv[0], False, True), -1)
        outs.append(ops.matmul(weights, kv[1], False, False))
    model = ov.Model([ops.concat(outs, 1)], params)
    if int8:
        return model
    ppp = PrePostProcessor(model)  # K/V handed over as bf16, as `graphs.OpenVINOGraph` does
    for layer in range(layers):
        for name in ("k", "v"):
            ppp.input(f"{name}{layer}").tensor().set_element_type(ov.Type.bf16)
    return ppp.build()


def feed(heads: int, layers: int, int8: bool) -> dict[str, object]:
    rng = np.random.default_rng(0)
    shape = (1, heads, POSITIONS, HEAD_DIM)
    out: dict[str, object] = {"q": rng.standard_normal((1, heads, 1, HEAD_DIM), np.float32)}
    for layer in range(layers):
        for name in ("k", "v"):
            if int8:
                out[f"{name}{layer}"] = rng.integers(-127, 128, shape, dtype=np.int8)
                out[f"{name}s{layer}"] = np.full((1, heads, POSITIONS, 1), 0.01, np.float32)
            else:
                bits = rng.standard_normal(shape).astype(ml_dtypes.bfloat16).view(np.uint16)
                out[f"{name}{layer}"] = ov.Tensor(bits, list(shape), ov.Type.bf16)
    return out


def median_ms(heads: int, layers: int, int8: bool, calls: int, threads: int) -> float:
    config = {"INFERENCE_PRECISION_HINT": "bf16", "INFERENCE_NUM_THREADS": threads,
              "SNIPPETS_MODE": "DISABLE"}  # fmt: skip
    compiled = ov.Core().compile_model(build(heads, layers, int8), "CPU", config)
    request, inputs = compiled.create_infer_request(), feed(heads, layers, int8)
    for _ in range(20):
        request.infer(inputs)
    walls = []
    for _ in range(calls):
        started = time.perf_counter()
        request.infer(inputs)
        walls.append(1000 * (time.perf_counter() - started))
    return statistics.median(walls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    for round_ in range(2):
        for int8 in (False, True):
            ms = median_ms(args.heads, args.layers, int8, args.calls, args.threads)
            print(f"round {round_ + 1}: K/V {'int8 + scale' if int8 else 'bf16'}: {ms:.3f} ms")


if __name__ == "__main__":
    main()
