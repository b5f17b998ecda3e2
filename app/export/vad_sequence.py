"""The Silero VAD's sequence graphs, built at `make models` (`python -m app.export vad`) beside
`silero_vad.onnx`: a whole clip through the VAD in a few calls, exactly as chunk after chunk
(`app.engine.vad_sequence` runs them; why and how fast is said there).

Silero VAD is recurrent, but only in its LSTM: the short-time spectrum and the four convolutions
in front of it see one chunk (and its 64 samples of context) at a time. So a whole clip is one
matrix product per layer over all its chunks at once, and the recurrence is ONNX's `LSTM` operator
over the chunk sequence. The graphs are derived from the weights of the Silero file itself (one
per sample-rate branch of its `If`), so the model file stays the one the wheel ships.

    chunks (gained) f32 [n, C] -> x [n, context + C] -> spectrum [n, 4, bins] -> 4 x conv k3
    -> [n, 128] -> LSTM over n steps -> ReLU -> 1x1 conv -> sigmoid -> probs f32 [n]

The convolutions are matrix products over windows gathered by slicing (their time axes are 4 frames
or fewer, where ONNX Runtime's `Conv` costs ~4x more). Each rate gets two graphs, cut where the
recurrence begins: the front (spectrum and convolutions, chunks independent of each other, so
blocks of them run side by side) and the LSTM with the output layer (in order).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from app.engine.vad import NARROW_RATE
from app.engine.vad_sequence import FEATURES, HIDDEN, PARTS, sequence_file

_END = 2**62  # "to the end" in a Slice


def write_sequence_graphs(vad_path: Path) -> list[Path]:
    """The sequence graph of each rate branch of the Silero file at `vad_path`, written beside
    it (`sequence_file`); raises `SequenceGraphError` for a graph that is not Silero's."""
    model = onnx.load(str(vad_path))
    written = []
    for rate, branch in branch_rates(model, NARROW_RATE).items():
        for part, graph in zip(PARTS, sequence_graphs(branch), strict=True):
            target = sequence_file(vad_path, rate, part)
            partial = target.with_suffix(".partial")
            onnx.save(graph, str(partial))
            partial.replace(target)
            written.append(target)
    return written


class SequenceGraphError(ValueError):
    """A Silero branch is not shaped as the sequence graph expects."""


def branch_rates(model: onnx.ModelProto, other_rate: int) -> dict[int, onnx.GraphProto]:
    """The Silero graph's sample-rate branches: {rate: branch}. The graph selects its `then`
    branch when `sr` equals the constant it compares with, else `other_rate`'s."""
    consts = {n.output[0]: n for n in model.graph.node if n.op_type == "Constant"}
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    equals = [n for n in model.graph.node if n.op_type == "Equal"]
    if len(ifs) != 1 or len(equals) != 1 or equals[0].input[1] not in consts:
        raise SequenceGraphError("expected one If on the sample rate at the top of the graph")
    rate = int(numpy_helper.to_array(consts[equals[0].input[1]].attribute[0].t))
    branches = {a.name: a.g for a in ifs[0].attribute}
    return {rate: branches["then_branch"], other_rate: branches["else_branch"]}


def sequence_graphs(branch: onnx.GraphProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The sequence graphs of one Silero rate branch, in `PARTS` order:

    front: x f32 [n, context + chunk] (chunk i with the last `context` samples of chunk i-1)
           -> features f32 [n, 1, 128]
    lstm:  features, h_in, c_in f32 [1, 1, 128] (the LSTM state before chunk 0)
           -> probs f32 [n], h_out, c_out f32 [1, 1, 128]
    """
    return _SequenceBuilder(branch).front(), _SequenceBuilder(branch).lstm()


class _SequenceBuilder:
    def __init__(self, branch: onnx.GraphProto) -> None:
        self.consts = {
            n.output[0]: numpy_helper.to_array(n.attribute[0].t)
            for n in branch.node
            if n.op_type == "Constant" and n.attribute[0].type == onnx.AttributeProto.TENSOR
        }
        self.convs = [n for n in branch.node if n.op_type == "Conv"]
        if len(self.convs) != 6:  # the spectrum, four encoder layers, the output layer
            raise SequenceGraphError(f"expected 6 Conv nodes, found {len(self.convs)}")
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def weight(self, suffix: str) -> np.ndarray:
        found = [a for k, a in self.consts.items() if k.endswith("__" + suffix)]
        if len(found) != 1:
            raise SequenceGraphError(f"expected one constant named *{suffix}, found {len(found)}")
        return found[0]

    def const(self, name: str, value: np.ndarray) -> str:
        """An initializer, named apart from the node outputs (prefix `c.`)."""
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), f"c.{name}"))
        return f"c.{name}"

    def node(self, op: str, inputs: list[str], output: str, **attrs: object) -> str:
        self.nodes.append(oh.make_node(op, inputs, [output], **attrs))
        return output

    def slice(self, x: str, out: str, start: int, end: int, axis: int, step: int = 1) -> str:
        bounds = [
            self.const(f"{out}.{key}", np.array([v], np.int64))
            for key, v in (("start", start), ("end", end), ("axis", axis), ("step", step))
        ]
        return self.node("Slice", [x, *bounds], out)

    def front(self) -> onnx.ModelProto:
        frame_pad = self.const("frame_pad", np.array([0, 1, 0, 0, 1, 0]))  # a frame a side
        h = self._spectrum("x")
        for i, conv in enumerate(self.convs[1:5]):
            h = self._conv3(h, conv, i, frame_pad)
        self.node("Reshape", [h, self.const("seq", np.array([-1, 1, HIDDEN]))], FEATURES)
        return self._model(
            "silero_front",
            [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "width"])],
            [oh.make_tensor_value_info(FEATURES, TensorProto.FLOAT, ["n", 1, HIDDEN])],
        )

    def lstm(self) -> onnx.ModelProto:
        flat = self.const("flat", np.array([-1, HIDDEN]))
        y = self.node("Reshape", [self._lstm(FEATURES), flat], "y")
        y = self.node("Relu", [y], "y_relu")
        out_w = self.weight("decoder.decoder.2.weight").reshape(1, HIDDEN).T  # [128, 1]
        logit = self.node("MatMul", [y, self.const("out_w", out_w)], "logit_w")
        logit = self.node(
            "Add", [logit, self.const("out_b", self.weight("decoder.decoder.2.bias"))], "logit"
        )
        prob = self.node("Sigmoid", [logit], "prob")
        self.node("Reshape", [prob, self.const("vector", np.array([-1]))], "probs")
        f32, state = TensorProto.FLOAT, [1, 1, HIDDEN]
        return self._model(
            "silero_lstm",
            [
                oh.make_tensor_value_info(FEATURES, f32, ["n", 1, HIDDEN]),
                oh.make_tensor_value_info("h_in", f32, state),
                oh.make_tensor_value_info("c_in", f32, state),
            ],
            [
                oh.make_tensor_value_info("probs", f32, ["n"]),
                oh.make_tensor_value_info("h_out", f32, state),
                oh.make_tensor_value_info("c_out", f32, state),
            ],
        )

    def _model(
        self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
    ) -> onnx.ModelProto:
        graph = oh.make_graph(self.nodes, name, inputs, outputs, self.inits)
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
        onnx.checker.check_model(model)
        return model

    def _spectrum(self, x: str) -> str:
        """x [n, L] -> magnitudes [n, frames, bins]: the branch's reflect padding on the right,
        then its STFT convolution (kernel = 2 x hop) as blocks of `hop` samples, pairwise."""
        basis = self.weight("stft.forward_basis_buffer")  # [2 bins, 1, kernel]
        [hop] = _ints(self.convs[0], "strides")
        kernel, bins = basis.shape[2], basis.shape[0] // 2
        pads = [k for k in self.consts if k.endswith("stft/padding/Constant_1_output_0")]
        if kernel != 2 * hop or len(pads) != 1:
            raise SequenceGraphError("unexpected STFT layout")
        right = int(self.consts[pads[0]][1])
        padded = self.node(
            "Pad", [x, self.const("stft_pad", np.array([0, 0, 0, right]))], "xp", mode="reflect"
        )
        blocks = self.node(
            "Reshape", [padded, self.const("blocks", np.array([0, -1, hop]))], "blocks"
        )
        first = self.slice(blocks, "blocks_first", 0, -1, 1)
        second = self.slice(blocks, "blocks_second", 1, _END, 1)
        frames = self.node("Concat", [first, second], "frames", axis=2)  # [n, frames, kernel]
        spec = self.node("MatMul", [frames, self.const("basis", basis[:, 0, :].T)], "spec")
        re = self.slice(spec, "re", 0, bins, 2)
        im = self.slice(spec, "im", bins, 2 * bins, 2)
        power = self.node(
            "Add", [self.node("Mul", [re, re], "re2"), self.node("Mul", [im, im], "im2")], "power"
        )
        return self.node("Sqrt", [power], "magnitude")

    def _conv3(self, h: str, conv: onnx.NodeProto, i: int, frame_pad: str) -> str:
        """ReLU(conv k3, pad 1, stride s) over the frames of h [n, T, C_in] -> [n, T', C_out]:
        the three taps side by side, one matrix product."""
        [stride] = _ints(conv, "strides")
        if _ints(conv, "kernel_shape") != [3] or _ints(conv, "pads") != [1, 1]:
            raise SequenceGraphError("unexpected encoder convolution")
        w = self.weight(f"encoder.{i}.reparam_conv.weight")  # [C_out, C_in, 3]
        framed = self.node("Pad", [h, frame_pad], f"e{i}_pad")
        taps = [
            self.slice(framed, f"e{i}_tap{k}", k, _END if k == 2 else k - 2, 1, stride)
            for k in range(3)
        ]
        stacked = self.node("Concat", taps, f"e{i}_taps", axis=2)  # [n, T', 3 C_in]
        w2 = w.transpose(2, 1, 0).reshape(-1, w.shape[0])  # [3 C_in, C_out], tap-major
        out = self.node("MatMul", [stacked, self.const(f"e{i}_w", w2)], f"e{i}_mm")
        bias = self.const(f"e{i}_b", self.weight(f"encoder.{i}.reparam_conv.bias"))
        return self.node("Relu", [self.node("Add", [out, bias], f"e{i}_add")], f"e{i}")

    def _lstm(self, seq: str) -> str:
        """PyTorch's LSTMCell weights (gates i, f, g, o) as ONNX's LSTM (gates i, o, f, c)."""

        def iofc(m: np.ndarray) -> np.ndarray:
            i, f, g, o = np.split(m, 4, axis=0)
            return np.concatenate([i, o, f, g], axis=0)

        w = iofc(self.weight("decoder.rnn.weight_ih"))[None]
        r = iofc(self.weight("decoder.rnn.weight_hh"))[None]
        b = np.concatenate(
            [iofc(self.weight("decoder.rnn.bias_ih")), iofc(self.weight("decoder.rnn.bias_hh"))]
        )[None]
        weights = [self.const("W", w), self.const("R", r), self.const("B", b)]
        lstm = oh.make_node(
            "LSTM", [seq, *weights, "", "h_in", "c_in"], ["Y", "h_out", "c_out"], hidden_size=HIDDEN
        )
        self.nodes.append(lstm)
        return "Y"


def _ints(node: onnx.NodeProto, name: str) -> list[int]:
    return next((list(a.ints) for a in node.attribute if a.name == name), [])
