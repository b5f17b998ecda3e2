"""CAM++ (3D-Speaker, 192-d speaker embeddings) as an ONNX graph, written op by op.

A 2-D residual front end over the fbank (FCM), a strided TDNN layer, three densely connected
blocks of context-aware masking (CAM) layers with transitions, statistics pooling (mean and
unbiased standard deviation over time) and a dense layer with batch norm. Batch norms are folded
into the convolution before them where there is one, else applied as a per-channel scale + shift.

    in:  features  f32 [B, frames, 80]   mean-normalised Kaldi fbank (`app.engine.speakers.fbank`)
    out: embedding f32 [B, 192]          not normalised
"""

from __future__ import annotations

import numpy as np
import onnx

from app.export.errors import BuildError
from app.export.graph_builder import GraphBuilder
from app.runtime import speaker_contract as io

BN_EPSILON = 1e-5
BLOCKS = ((12, 3, 1), (24, 3, 2), (16, 3, 2))  # (layers, kernel, dilation) per dense block
SEGMENT_FRAMES = 100  # CAM's segment pooling length


class _Campplus:
    """Emits the graph; `w` is the CAM++ state dict."""

    def __init__(self, w: dict[str, np.ndarray]) -> None:
        self.w = w
        self.g = GraphBuilder("campplus")

    def _bn(self, prefix: str) -> tuple[np.ndarray, np.ndarray]:
        """Batch norm as y = x * scale + shift (per channel)."""
        w = self.w
        scale = 1.0 / np.sqrt(w[f"{prefix}.running_var"].astype(np.float64) + BN_EPSILON)
        shift = -w[f"{prefix}.running_mean"] * scale
        if f"{prefix}.weight" in w:
            scale, shift = scale * w[f"{prefix}.weight"], shift * w[f"{prefix}.weight"]
            shift = shift + w[f"{prefix}.bias"]
        return scale.astype(np.float32), shift.astype(np.float32)

    def conv_bn(self, x: str, conv: str, bn: str, dims: int, **attrs) -> str:
        """A bias-free convolution followed by a batch norm, folded into one convolution."""
        scale, shift = self._bn(bn)
        weight = self.w[f"{conv}.weight"] * scale.reshape(-1, *[1] * (dims + 1))
        g = self.g
        return g.op(
            "Conv",
            [x, g.weight(f"{conv}.weight", weight), g.weight(f"{conv}.bias", shift)],
            **attrs,
        )

    def bn_relu(self, x: str, bn: str) -> str:
        """Batch norm (scale + shift over channels of [B, C, T]) then ReLU."""
        scale, shift = self._bn(bn)
        g = self.g
        scaled = g.op("Mul", [x, g.weight(f"{bn}.scale", scale[:, None])])
        return g.op("Relu", [g.op("Add", [scaled, g.weight(f"{bn}.shift", shift[:, None])])])

    def conv(self, x: str, prefix: str, **attrs) -> str:
        g = self.g
        inputs = [x, g.weight(f"{prefix}.weight", self.w[f"{prefix}.weight"])]
        if f"{prefix}.bias" in self.w:
            inputs.append(g.weight(f"{prefix}.bias", self.w[f"{prefix}.bias"]))
        return g.op("Conv", inputs, **attrs)

    def res_block(self, x: str, prefix: str, stride: int) -> str:
        g = self.g
        h = g.op(
            "Relu",
            [
                self.conv_bn(
                    x,
                    f"{prefix}.conv1",
                    f"{prefix}.bn1",
                    2,
                    kernel_shape=[3, 3],
                    pads=[1, 1, 1, 1],
                    strides=[stride, 1],
                )
            ],
        )
        h = self.conv_bn(h, f"{prefix}.conv2", f"{prefix}.bn2", 2, pads=[1, 1, 1, 1])
        shortcut = x
        if f"{prefix}.shortcut.0.weight" in self.w:
            shortcut = self.conv_bn(
                x, f"{prefix}.shortcut.0", f"{prefix}.shortcut.1", 2, strides=[stride, 1]
            )
        return g.op("Relu", [g.op("Add", [h, shortcut])])

    def head(self, features: str) -> str:
        """FCM: [B, frames, 80] -> [B, 320, frames]."""
        g = self.g
        x = g.op("Transpose", [features], perm=[0, 2, 1])
        x = g.op("Unsqueeze", [x, g.const(np.array([1], np.int64))])  # [B, 1, 80, T]
        x = g.op("Relu", [self.conv_bn(x, "head.conv1", "head.bn1", 2, pads=[1, 1, 1, 1])])
        for layer in ("layer1", "layer2"):
            x = self.res_block(x, f"head.{layer}.0", stride=2)
            x = self.res_block(x, f"head.{layer}.1", stride=1)
        x = self.conv_bn(x, "head.conv2", "head.bn2", 2, pads=[1, 1, 1, 1], strides=[2, 1])
        x = g.op("Relu", [x])  # [B, 32, 10, T]
        channels = self.w["head.conv2.weight"].shape[0] * io.FBANK_BINS // 8
        return g.op("Reshape", [x, g.const(np.array([0, channels, -1], np.int64))])

    def timeline(self, x: str) -> None:
        """The frame count of x [B, C, T] (every CAM layer's T) and what segment pooling needs
        for it: the zeros appended to fill the last segment, and each segment's frame count."""
        g = self.g
        self.length = g.op("Gather", [g.op("Shape", [x]), g.const(np.array([2], np.int64))])
        segment = g.const(np.array([SEGMENT_FRAMES], np.int64))
        appended = g.op("Mod", [g.op("Neg", [self.length]), segment])  # [1]
        self.pads = g.op("Concat", [g.const(np.zeros(5, np.int64)), appended], axis=0)
        shape = g.op("Concat", [g.const(np.array([1, 1], np.int64)), self.length], axis=0)
        ones = g.op("Expand", [g.const(np.ones((1, 1, 1), np.float32)), shape])  # [1, 1, T]
        self.counts = self.segment_sums(ones)  # [1, 1, n]

    def segment_sums(self, x: str) -> str:
        """Sums over consecutive segments of `SEGMENT_FRAMES` frames (the last one shorter):
        [B, C, T] -> [B, C, n]."""
        g = self.g
        segments = g.const(np.array([0, 0, -1, SEGMENT_FRAMES], np.int64))
        padded = g.op("Reshape", [g.op("Pad", [x, self.pads]), segments])
        return g.op("ReduceSum", [padded, g.const(np.array([3], np.int64))], keepdims=0)

    def spread(self, x: str) -> str:
        """Each segment's value over its frames: [B, C, n] -> [B, C, T]."""
        g = self.g
        repeated = g.op(
            "Expand",
            [
                g.op("Unsqueeze", [x, g.const(np.array([3], np.int64))]),
                g.const(np.array([1, 1, 1, SEGMENT_FRAMES], np.int64)),
            ],
        )
        flat = g.op("Reshape", [repeated, g.const(np.array([0, 0, -1], np.int64))])
        axis = g.const(np.array([2], np.int64))
        return g.op("Slice", [flat, g.const(np.array([0], np.int64)), self.length, axis])

    def cam_layer(self, x: str, prefix: str, dilation: int) -> str:
        """The masking gate depends on the whole-input mean plus each segment's mean, so it is
        constant over a segment: computed per segment and spread (3D-Speaker computes it per
        frame, the same numbers)."""
        g = self.g
        h = self.bn_relu(x, f"{prefix}.nonlinear1.batchnorm")
        h = self.conv_bn(h, f"{prefix}.linear1", f"{prefix}.nonlinear2.batchnorm", 1)
        h = g.op("Relu", [h])
        cam = f"{prefix}.cam_layer"
        local = self.conv(h, f"{cam}.linear_local", pads=[dilation, dilation], dilations=[dilation])
        mean = g.op("ReduceMean", [h, g.const(np.array([2], np.int64))], keepdims=1)
        segment_means = g.op("Div", [self.segment_sums(h), self.counts])  # [B, C, n]
        context = g.op("Add", [mean, segment_means])
        gate = g.op("Relu", [self.conv(context, f"{cam}.linear1")])
        gate = g.op("Sigmoid", [self.conv(gate, f"{cam}.linear2")])
        return g.op("Mul", [local, self.spread(gate)])

    def xvector(self, x: str) -> str:
        """[B, 320, T] -> [B, 192]."""
        g = self.g
        x = self.conv_bn(
            x,
            "xvector.tdnn.linear",
            "xvector.tdnn.nonlinear.batchnorm",
            1,
            strides=[2],
            pads=[2, 2],
        )
        x = g.op("Relu", [x])
        self.timeline(x)
        for i, (layers, _kernel, dilation) in enumerate(BLOCKS, start=1):
            for j in range(1, layers + 1):
                new = self.cam_layer(x, f"xvector.block{i}.tdnnd{j}", dilation)
                x = g.op("Concat", [x, new], axis=1)
            transit = f"xvector.transit{i}"
            x = self.conv(self.bn_relu(x, f"{transit}.nonlinear.batchnorm"), f"{transit}.linear")
        x = self.bn_relu(x, "xvector.out_nonlinear.batchnorm")
        axis = g.const(np.array([2], np.int64))
        mean = g.op("ReduceMean", [x, axis], keepdims=1)
        centred = g.op("Sub", [x, mean])
        frames = g.op(
            "Cast", [g.op("Gather", [g.op("Shape", [x]), g.const(np.array([2], np.int64))])], to=1
        )
        variance = g.op(
            "Div",
            [
                g.op("ReduceSum", [g.op("Mul", [centred, centred]), axis], keepdims=0),
                g.op("Sub", [frames, g.const(np.float32(1.0))]),
            ],
        )
        stats = g.op(
            "Concat",
            [g.op("Squeeze", [mean, axis]), g.op("Sqrt", [variance])],
            axis=1,
        )  # [B, 2 C]
        scale, shift = self._bn("xvector.dense.nonlinear.batchnorm")
        dense = self.w["xvector.dense.linear.weight"][:, :, 0] * scale[:, None]  # [192, 2 C]
        return g.linear(stats, dense, shift, "xvector.dense")

    def build(self) -> onnx.ModelProto:
        g = self.g
        features = g.input(io.EMBEDDING_INPUT, np.float32, ["batch", "frames", io.FBANK_BINS])
        embedding = self.xvector(self.head(features))
        g.output(embedding, io.EMBEDDING_OUTPUT, np.float32, ["batch", io.EMBEDDING_DIM])
        return g.model()


def build_campplus(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    """The graph of a CAM++ state dict (`campplus_cn_en_common.pt`)."""
    try:
        return _Campplus(w).build()
    except KeyError as e:
        raise BuildError(f"the CAM++ weights lack {e.args[0]}") from e
