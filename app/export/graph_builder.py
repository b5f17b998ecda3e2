"""A small builder over `onnx.helper`: named values in and out, weights as initializers."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 18
_ONNX_TYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.bool_): TensorProto.BOOL,
}


INT8_GROUP = 64  # input channels per int8 scale
# prefix of a probe graph's outputs: an int8 input's max |x| per channel
RANGE_OUTPUT = "range."


@dataclass(frozen=True)
class WeightFormat:
    """How parameters are stored in the graph files.

    dtype: numpy name of every parameter's storage ("float32" or "float16"); compute is fp32.
    int8_matrices: matrix weights (linear layers and the token embedding, ~95 % of the
        parameters) are stored as int8 with an fp16 scale per output channel and group of
        `INT8_GROUP` input channels (symmetric, no zero point); OpenVINO keeps them compressed.
    int8_inputs: the encoder's linear layers that take int8 inputs do so (`linear()`), with
        ranges calibrated on speech at build time (`app.export.calibration`).
    """

    dtype: str = "float32"
    int8_matrices: bool = False
    int8_inputs: bool = False


@dataclass(frozen=True)
class Int8Table:
    """The graph values of an `int8_table`: int8 [rows, cols], f32 scale [rows], zero [rows]."""

    values: str
    cols: int
    scale: str
    zero: str
    row_scale: str  # the scale as [rows, 2], each twice (`GraphBuilder.lookup`)
    unsmoothing: str | None  # 1 / the smoothing [cols], if any


def quantize_int8(rows: np.ndarray, group: int = INT8_GROUP) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 of a matrix [out, in] with one scale per row and group of `group` columns.

    Returns q int8 [out, in / group, group] (values in [-127, 127]) and scale fp16
    [out, in / group, 1], with rows ~= (q * scale).reshape(out, in). A row length that `group`
    does not divide gets one scale per row.
    """
    values = np.asarray(rows, np.float32)
    out_dim, in_dim = values.shape
    group = group if in_dim % group == 0 else in_dim
    grouped = values.reshape(out_dim, in_dim // group, group)
    scale = (np.abs(grouped).max(axis=2, keepdims=True) / 127.0).astype(np.float16)
    scale = np.where(scale > 0, scale, np.float16(1.0))
    q = np.clip(np.rint(grouped / scale.astype(np.float32)), -127, 127).astype(np.int8)
    return q, scale


class GraphBuilder:
    """Collects nodes, initializers and I/O of one graph.

    `weight()` and `matrix()` store a parameter once (per `WeightFormat`) and return an fp32 value
    to compute with: fp16 parameters are followed by a Cast, int8 ones by Cast -> Mul(scale) ->
    Reshape, so arithmetic, LayerNorm and Softmax stay fp32.
    """

    def __init__(
        self,
        name: str,
        weight_format: WeightFormat = WeightFormat(),
        input_ranges: Mapping[str, np.ndarray] | None = None,
        probe_ranges: bool = False,
    ) -> None:
        """input_ranges: max |input| per input channel of the linear layers whose input is to be
        int8 (`linear(..., int8_input=True)`), by the prefix of the first layer that reads each
        such input; probe_ranges: instead give each such input's max |x| per channel as an
        output `range.<prefix>` (the graph a calibration runs to find them). Layers that read one
        value (the cross K/V projections all read the encoder's output) share its range and its
        int8 round trip."""
        self.name = name
        self.weight_format = weight_format
        self.input_ranges = input_ranges
        self.probe_ranges = probe_ranges
        self.weight_dtype = np.dtype(weight_format.dtype)
        self.nodes: list[onnx.NodeProto] = []
        self._tensors: list[tuple[str, np.ndarray]] = []  # initializers, made protos in model()
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._weights: dict[str, str] = {}
        self._int8_values: dict[str, str] = {}  # value -> its int8 round trip (in a probe: itself)
        self._ids = itertools.count()

    @property
    def int8_inputs(self) -> bool:
        """Whether layers marked for int8 inputs get them (with ranges, or probing for them)."""
        return self.weight_format.int8_inputs and (
            self.probe_ranges or self.input_ranges is not None
        )

    def _fresh(self, hint: str) -> str:
        return f"{hint}_{next(self._ids)}"

    def input(self, name: str, dtype: type, shape: Sequence[int | str]) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, _ONNX_TYPES[np.dtype(dtype)], shape))
        return name

    def output(self, value: str, name: str, dtype: type, shape: Sequence[int | str]) -> None:
        self.op("Identity", [value], name=name)
        self.outputs.append(
            helper.make_tensor_value_info(name, _ONNX_TYPES[np.dtype(dtype)], shape)
        )

    def const(self, array: np.ndarray | float | int | Sequence, hint: str = "const") -> str:
        """A small constant (shapes, scalars), stored as given."""
        array = np.asarray(array)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        name = self._fresh(hint)
        self._tensors.append((name, array))
        return name

    def weight(self, name: str, array: np.ndarray) -> str:
        """A parameter, stored once under `name`; returns an fp32 value."""
        if name in self._weights:
            return self._weights[name]
        self._tensors.append((name, np.ascontiguousarray(array, dtype=self.weight_dtype)))
        value = name
        if self.weight_dtype != np.float32:
            value = self.op("Cast", [name], to=TensorProto.FLOAT, name=f"{name}_fp32")
        self._weights[name] = value
        return value

    def matrix(self, name: str, array: np.ndarray, channel_axis: int) -> str:
        """A 2-D parameter whose output channels run along `channel_axis`; an fp32 value.

        int8 in groups (`quantize_int8`) when the format says so, else as `weight()`. The int8
        form is expanded by Cast -> Mul(scale) -> Reshape: OpenVINO keeps it as compressed
        weights expanded inside the matrix multiply, and ONNX Runtime's CPU EP folds it into
        fp32 weights at load (with an fp16 Mul it would expand them on every call, 3.6x slower).
        """
        if not self.weight_format.int8_matrices:
            return self.weight(name, array)
        if name in self._weights:
            return self._weights[name]
        rows = array if channel_axis == 0 else array.T  # [out, in]
        q, scale = quantize_int8(rows, INT8_GROUP)
        self._tensors.append((name, q))
        value = self.op("Cast", [name], to=TensorProto.FLOAT)
        value = self.op("Mul", [value, self.weight(f"{name}.scale", scale)])
        value = self.op(
            "Reshape", [value, self.const(np.array(rows.shape, np.int64))], name=f"{name}_fp32"
        )
        if channel_axis == 1:
            value = self.op("Transpose", [value], perm=[1, 0])
        self._weights[name] = value
        return value

    def _int8_input(self, x: str, prefix: str, channels: int) -> str:
        """x [..., channels] as an int8 layer input, made once per value for the first layer
        (`prefix`) that reads it: in a probe, x itself with its max |x| per channel as an output;
        else x through int8 and back, symmetric per tensor, the scale its range / 127."""
        if x not in self._int8_values:
            if self.probe_ranges:
                rows = self.op("Reshape", [x, self.const(np.array([-1, channels], np.int64))])
                reach = self.op("ReduceMax", [self.op("Abs", [rows]), self.const([0])], keepdims=0)
                self.output(reach, f"{RANGE_OUTPUT}{prefix}", np.float32, [channels])
                self._int8_values[x] = x
            else:
                assert self.input_ranges is not None
                reach = float(np.max(self.input_ranges[prefix]))
                scale = self.const(np.float32(reach / 127.0 if reach > 0 else 1.0), f"{x}_scale")
                zero = self.const(np.int8(0), f"{x}_zero")
                q = self.op("QuantizeLinear", [x, scale, zero])
                self._int8_values[x] = self.op("DequantizeLinear", [q, scale, zero])
        return self._int8_values[x]

    def _int8_channels(self, name: str, weight: np.ndarray) -> str:
        """W [out, in] as int8 [in, out] with an f32 scale per output channel; an fp32 value."""
        q, scale = quantize_int8(weight, group=weight.shape[1])  # one group: the whole row
        self._tensors.append((name, np.ascontiguousarray(q[:, 0, :].T)))
        scale_name = self.const(scale.reshape(-1).astype(np.float32), f"{name}_scale")
        zero = self.const(np.zeros(weight.shape[0], np.int8), f"{name}_zero")
        return self.op("DequantizeLinear", [name, scale_name, zero], axis=1)

    def int8_table(
        self, name: str, table: np.ndarray, smoothing: np.ndarray | None = None
    ) -> Int8Table:
        """table [rows, cols] stored as int8 with an f32 scale per row, for `lookup` and
        `int8_projection` to share. smoothing [cols] (SmoothQuant): the stored table is
        table * smoothing per column, and both uses divide it out again (a lookup's rows, the
        projection's input), so x @ table^T is computed as (x / s) @ (table * s)^T: the int8
        input's outlier channels are scaled down and the table's columns up to match."""
        cols = table.shape[1]
        s = np.ones(cols, np.float32) if smoothing is None else smoothing.astype(np.float32)
        q, scale = quantize_int8(table * s, group=cols)  # one group: the whole row
        self._tensors.append((name, np.ascontiguousarray(q[:, 0, :])))
        scale = scale.reshape(-1).astype(np.float32)
        return Int8Table(
            name,
            cols,
            self.const(scale, f"{name}_scale"),
            self.const(np.zeros(len(table), np.int8), f"{name}_zero"),
            self.const(np.repeat(scale[:, None], 2, axis=1), f"{name}_row_scale"),
            None if smoothing is None else self.const(1 / s, f"{name}_unsmoothing"),
        )

    def lookup(self, table: Int8Table, ids: str) -> str:
        """Rows `ids` of an `int8_table` as f32: the int8 rows gathered, then scaled. Gathering
        the int8 values themselves keeps OpenVINO from expanding the table: in a graph that also
        has int8 inputs it leaves a Gather over the dequantized table to its low-precision passes,
        which fold that table into f32 (tiny.en's 20 MB embedding became 80 MB). The scales are
        gathered from `[rows, 2]` (each twice) and sliced: OpenVINO 2025.4's CPU Gather of one f32
        per row with a bf16 output copies f32 bytes as bf16 (the rows' scales came out as another
        row's or ~1e-16)."""
        rows = self.op("Cast", [self.op("Gather", [table.values, ids])], to=TensorProto.FLOAT)
        pairs = self.op("Gather", [table.row_scale, ids])  # [..., 2]
        row_scale = self.op("Slice", [pairs, self.const([0]), self.const([1]), self.const([-1])])
        return self._unsmoothed(self.op("Mul", [rows, row_scale]), table)

    def int8_projection(self, x: str, table: Int8Table, prefix: str) -> str:
        """x [N, cols] @ table^T -> [N, rows], x through its int8 round trip (`_int8_input`, the
        range under `prefix`) and the table dequantized per row: OpenVINO's int8 matrix multiply
        over the stored int8 table (at 5 rows on tiny.en's 51864 x 384 logits projection ~0.6 ms
        against 2.1 for the weights expanded to bf16 inside the product)."""
        weight = self.op("DequantizeLinear", [table.values, table.scale, table.zero], axis=0)
        x = self._int8_input(self._unsmoothed(x, table), prefix, table.cols)
        return self.op("Gemm", [x, weight], transB=1)

    def _unsmoothed(self, x: str, table: Int8Table) -> str:
        """x [..., cols] divided by the table's smoothing (itself without one)."""
        return x if table.unsmoothing is None else self.op("Mul", [x, table.unsmoothing])

    def op(self, op_type: str, inputs: Sequence[str], name: str | None = None, **attrs) -> str:
        """One node with one output; returns the output's name."""
        out = name or self._fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def model(self) -> onnx.ModelProto:
        """The graph; the builder's arrays go into it one by one (each dropped once copied, so
        the weights are never held twice: a large-v3 decoder is ~0.8 GB even in int8)."""
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs)
        tensors, self._tensors = self._tensors[::-1], []
        while tensors:
            name, array = tensors.pop()
            graph.initializer.append(numpy_helper.from_array(array, name))
            del array
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="app.export"
        )
        model.ir_version = 9
        return model

    # Layers shared by the encoder and the decoder

    def linear(
        self,
        x: str,
        weight: np.ndarray,
        bias: np.ndarray | None,
        prefix: str,
        int8_input: bool = False,
    ) -> str:
        """x [..., in] @ W^T + b -> [..., out]; W [out, in] is stored transposed.

        int8_input: the layer may compute in int8 (see `__init__`): with a range for it, x is
        quantized per tensor (QuantizeLinear -> DequantizeLinear, scale max |x| / 127) and W is
        int8 with a scale per output channel, the pattern OpenVINO runs as an int8 matrix
        multiply (VNNI) and ONNX Runtime as its integer MatMul."""
        if int8_input and self.int8_inputs:
            x = self._int8_input(x, prefix, weight.shape[1])
        if int8_input and self.input_ranges is not None:
            w = self._int8_channels(f"{prefix}.weight_t", weight)
        else:
            w = self.matrix(f"{prefix}.weight_t", weight.T, channel_axis=1)
        y = self.op("MatMul", [x, w])
        if bias is None:
            return y
        return self.op("Add", [y, self.weight(f"{prefix}.bias", bias)])

    def layer_norm(self, x: str, gamma: np.ndarray, beta: np.ndarray, prefix: str) -> str:
        scale = self.weight(f"{prefix}.weight", gamma)
        shift = self.weight(f"{prefix}.bias", beta)
        return self.op("LayerNormalization", [x, scale, shift], axis=-1, epsilon=1e-5)

    def gelu(self, x: str) -> str:
        """Exact GELU: 0.5 x (1 + erf(x / sqrt 2))."""
        erf = self.op("Erf", [self.op("Mul", [x, self.const(np.float32(1 / np.sqrt(2)))])])
        one_plus = self.op("Add", [erf, self.const(np.float32(1.0))])
        return self.op("Mul", [self.op("Mul", [x, one_plus]), self.const(np.float32(0.5))])

    def split_heads(self, x: str, n_heads: int, head_dim: int) -> str:
        """[B, T, D] -> [B, H, T, Dh]."""
        shaped = self.op("Reshape", [x, self.const(np.array([0, 0, n_heads, head_dim], np.int64))])
        return self.op("Transpose", [shaped], perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, d_model: int) -> str:
        """[B, H, T, Dh] -> [B, T, D]."""
        moved = self.op("Transpose", [x], perm=[0, 2, 1, 3])
        return self.op("Reshape", [moved, self.const(np.array([0, 0, d_model], np.int64))])

    def attention_weights(self, q: str, k: str, head_dim: int, bias: str | None = None) -> str:
        """softmax(q k^T / sqrt(Dh) + bias): q [B, H, T, Dh], k [B|1, H, S, Dh] -> [B, H, T, S]."""
        # The scale goes on q, the small operand: on the scores OpenVINO moves it onto k, and
        # then scales every cached or cross key on every call.
        scaled_q = self.op("Mul", [q, self.const(np.float32(head_dim**-0.5))])
        k_t = self.op("Transpose", [k], perm=[0, 1, 3, 2])
        scores = self.op("MatMul", [scaled_q, k_t])
        if bias is not None:
            scores = self.op("Add", [scores, bias])
        return self.op("Softmax", [scores], axis=-1)

    def attention(self, q: str, k: str, v: str, head_dim: int, bias: str | None = None) -> str:
        """softmax(q k^T / sqrt(Dh) + bias) v.

        q [B, H, T, Dh], k/v [B|1, H, S, Dh] -> [B, H, T, Dh].
        """
        return self.op("MatMul", [self.attention_weights(q, k, head_dim, bias), v])
