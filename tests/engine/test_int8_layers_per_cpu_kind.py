"""Every int8-input layer of the graphs the service serves computes its integer result on the CPU
kind the suite runs on (real, or held by `ONEDNN_MAX_CPU_ISA`: `make test-cpus`).

A layer means: x on its per-tensor int8 grid (QuantizeLinear's scale, saturating at -128 and
127), times the int8 weights, summed exactly, times the two scales. Without int8 dot products the
CPU's int8 kernels add u8 x s8 products in pairs into int16 and saturate (up to ~10 % of the
output range): the runtimes must then compute such layers in float (`app.runtime.cpu_kind`).
Each layer is cut out of the model's own graph file (its nodes and weights as stored) and run
alone, through `open_graph` as the service opens graphs, on inputs that fill its int8 grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from app.runtime.cpu_kind import this_cpu
from app.runtime.placement import open_graph
from tests.conftest import model_dir

pytestmark = pytest.mark.cpu_kind  # `make test-cpus` runs it under each CPU kind
ON_ONNX_RUNTIME = pytest.param("cpu", marks=pytest.mark.per_arithmetic)  # its kernels: the CPU's

ROWS = 64  # input rows a layer is run on


@dataclass(frozen=True)
class Int8Layer:
    """One int8-input layer of a graph: its nodes (QuantizeLinear -> DequantizeLinear of x, the
    weights' DequantizeLinear, MatMul or Gemm) and their initializers."""

    name: str
    nodes: list[onnx.NodeProto]
    initializers: dict[str, np.ndarray]
    x: str  # the layer's input value
    y: str  # its output value

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes,
            self.name,
            [helper.make_tensor_value_info(self.x, onnx.TensorProto.FLOAT, [ROWS, self.inputs])],
            [helper.make_tensor_value_info(self.y, onnx.TensorProto.FLOAT, None)],
            [numpy_helper.from_array(v, k) for k, v in self.initializers.items()],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        model.ir_version = 9
        return model

    def _node(self, op_type: str) -> onnx.NodeProto:
        return next(n for n in self.nodes if n.op_type == op_type)

    @property
    def _product(self) -> onnx.NodeProto:
        return next(n for n in self.nodes if n.op_type in ("MatMul", "Gemm"))

    @property
    def _weight_dq(self) -> onnx.NodeProto:
        return next(n for n in self.nodes if n.output[0] == self._product.input[1])

    def _weights(self) -> tuple[np.ndarray, np.ndarray]:
        """int8 W [in, out] and its f32 scale [out]."""
        dq = self._weight_dq
        w = self.initializers[dq.input[0]].astype(np.int64)
        scale = self.initializers[dq.input[1]].astype(np.float64)
        transposed = any(a.name == "transB" and a.i for a in self._product.attribute)
        return (w.T if transposed else w), scale

    @property
    def inputs(self) -> int:
        return self._weights()[0].shape[0]

    @property
    def step(self) -> float:
        return float(self.initializers[self._node("QuantizeLinear").input[1]])

    def integer_result(self, x: np.ndarray) -> np.ndarray:
        """What the layer means, in integers then scaled (f64)."""
        xq = np.clip(np.rint(x.astype(np.float64) / self.step), -128, 127).astype(np.int64)
        w, scale = self._weights()
        return (xq @ w) * self.step * scale


def int8_layers(path: Path) -> list[Int8Layer]:
    """The int8-input layers of the graph at `path` (weights read from its data file)."""
    model = onnx.load(str(path))
    made = {o: n for n in model.graph.node for o in n.output}
    stored = {i.name: i for i in model.graph.initializer}
    layers = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        x_dq, w_dq = made.get(node.input[0]), made.get(node.input[1])
        if x_dq is None or x_dq.op_type != "DequantizeLinear" or w_dq is None:
            continue
        quantize = made[x_dq.input[0]]
        nodes = [quantize, x_dq, w_dq, node]
        names = {i for n in nodes for i in n.input if i in stored}
        layers.append(
            Int8Layer(
                w_dq.input[0],
                nodes,
                {name: numpy_helper.to_array(stored[name]) for name in sorted(names)},
                quantize.input[0],
                node.output[0],
            )
        )
    return layers


@pytest.mark.parametrize("ep", ["openvino", ON_ONNX_RUNTIME])
@pytest.mark.parametrize("stage", ["encoder", "decoder"])
@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_every_int8_layer_served_gives_its_integer_result_on_this_cpu_kind(
    name: str, stage: str, ep: str, tmp_path: Path
) -> None:
    layers = int8_layers(model_dir(name) / f"{stage}.onnx")
    assert layers, f"{name}/{stage} has no int8-input layer"
    rng = np.random.default_rng(0)
    worst: dict[str, float] = {}
    for i, layer in enumerate(layers):
        path = tmp_path / f"layer{i}.onnx"
        onnx.save(layer.model(), path)
        graph = open_graph(path, ep, "CPU", 1, inference_precision="f32")
        # the grid's whole range, with a tenth beyond it (saturating as QuantizeLinear does);
        # never near a rounding boundary, where x / step in f32 or f64 could round either way
        shape = (ROWS, layer.inputs)
        steps = rng.integers(-140, 141, shape) + rng.uniform(-0.4, 0.4, shape)
        x = (steps * layer.step).astype(np.float32)
        (y,) = graph.run([layer.y], {layer.x: x})
        expected = layer.integer_result(x)
        worst[layer.name] = float(np.abs(y - expected).max() / np.abs(expected).max())
    off = {k: round(v, 4) for k, v in worst.items() if v > 1e-5}
    assert not off, f"off their integer results on {this_cpu().name} ({ep}): {off}"
