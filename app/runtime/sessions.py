"""The graphs of one model folder, placed on devices by an explicit policy.

`ep="openvino"`: OpenVINO's own runtime, on AUTO | NPU | GPU | CPU, with AUTO = NPU, else GPU,
else CPU as OpenVINO reports them; a device asked for by name that is missing is an error, never a
silent CPU fallback. `ep="cpu"`: ONNX Runtime's CPU provider, the reference. See `graphs`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from app.runtime import alignment, contract, mapped_weights
from app.runtime.contract import ContractError, Manifest
from app.runtime.cpu_kind import CpuKind, this_cpu
from app.runtime.graphs import (
    BF16,
    FLOAT_INT8_INPUTS,
    Graph,
    OpenVINOGraph,
    OrtGraph,
    openvino_devices,
)
from app.runtime.steps import Steps, serve_steps

log = logging.getLogger(__name__)
T = TypeVar("T")

EXECUTION_PROVIDERS = ("openvino", "cpu")
DEVICES = ("AUTO", "NPU", "GPU", "CPU")
_AUTO_ORDER = ("NPU", "GPU", "CPU")


class DeviceError(RuntimeError):
    """The requested execution provider or device is not available here."""


@dataclass(frozen=True)
class RuntimeOptions:
    """Where and how a model runs.

    threads: intra-op threads per session (0 = ONNX Runtime's default: one per core).
    inference_precision: OpenVINO `INFERENCE_PRECISION_HINT` ("bf16", "f16", "f32"); None = the
        device's default; "auto" = bf16 on a CPU with native bf16 (AVX-512 BF16 or AMX), else None.
    activation_quantization: OpenVINO CPU, int8 weight files: "on" = the int8 linear layers
        quantize their inputs too, per token in groups of 32 (int8 x int8 products, as
        CTranslate2's int8 does); "off" = the weights are expanded inside an f32/bf16 product;
        "auto" = off (it changes words on today's files: `_activation_groups`).
    """

    ep: str = "openvino"
    device: str = "AUTO"
    encoder_device: str | None = None
    decoder_device: str | None = None
    threads: int = 0
    cache_dir: Path | None = None
    inference_precision: str | None = None
    activation_quantization: str = "auto"

    def __post_init__(self) -> None:
        if self.ep not in EXECUTION_PROVIDERS:
            raise DeviceError(f"unknown execution provider {self.ep!r}: use openvino or cpu")
        for device in (self.device, self.encoder_device, self.decoder_device):
            if device is not None and device.split(".")[0].upper() not in DEVICES:
                raise DeviceError(f"unknown device {device!r}: use one of {', '.join(DEVICES)}")
        if self.threads < 0:
            raise DeviceError("threads must be >= 0")
        if self.activation_quantization not in ACTIVATION_QUANTIZATION:
            raise DeviceError(
                f"unknown activation quantization {self.activation_quantization!r}: "
                f"use {', '.join(ACTIVATION_QUANTIZATION)}"
            )
        if self.inference_precision not in (None, *PRECISIONS):
            raise DeviceError(
                f"unknown precision {self.inference_precision!r}: use {', '.join(PRECISIONS)}"
            )


def resolve_device(requested: str, available: list[str]) -> str:
    """The OpenVINO device_type to use for `requested` (AUTO or a name) given `available`."""
    requested = requested.upper()
    families = {d.split(".")[0]: d for d in reversed(available)}
    if requested == "AUTO":
        for family in _AUTO_ORDER:
            if family in families:
                return family
        raise DeviceError(f"OpenVINO reports no usable device (found: {available or 'none'})")
    if requested in available or requested in families:
        return requested
    raise DeviceError(
        f"device {requested} was asked for but OpenVINO reports only: "
        f"{', '.join(available) or 'no devices'}"
    )


PRECISIONS = ("auto", "bf16", "f16", "f32")
ACTIVATION_QUANTIZATION = ("auto", "on", "off")
ACTIVATION_GROUP = 32  # inputs per quantization scale when activations are quantized


def _activation_groups(activation_quantization: str) -> int:
    """OpenVINO CPU's `DYNAMIC_QUANTIZATION_GROUP_SIZE` for int8 weights (0 = off).

    Measured on a CPU without native bf16 (f32 compute, `benchmarks/results/decoder_state.md`):
    on, the int8 linear layers take 1.5 instead of 2.3 ms of a tiny.en step, the 60 s clip
    decodes 20-30 % faster with the same words, and a row's logits are the same bit for bit alone
    or packed with others (off: they differ by ~1e-5). Under bf16 (measured on a CPU with
    AVX-512 BF16) it gave no speed and the logits depend on the call's row count, so auto = off
    there. Without int8 dot products (AVX2 only) OpenVINO does not apply it. And with today's
    files (the smoothed int8 encoder, the int8 logits projection) it changes words: on the
    AVX-512 VNNI and AVX2 + AVX-VNNI kinds (held by ONEDNN_MAX_CPU_ISA, 2026-12-02) tiny.en read
    "stuff it" where the exact computation reads "stuffed it" (`benchmarks/results/cpu_kinds.md`),
    so its speed does not count: auto = off on every kind, "on" only when asked (a row's logits
    then differ by ~1e-5 with the rows beside it, as under bf16)."""
    return ACTIVATION_GROUP if activation_quantization == "on" else 0


def openvino_properties(
    device: str,
    precision: str | None,
    activation_quantization: str = "auto",
    threads: int = 0,
    cache_dir: Path | None = None,
    kind: CpuKind | None = None,
) -> dict[str, str]:
    """OpenVINO compile properties for one graph on `device`, for the CPU `kind` (default: this
    one, as `ONEDNN_MAX_CPU_ISA` holds it)."""
    kind = kind or this_cpu()
    family = device.split(".")[0]
    properties: dict[str, str] = {}
    precision = resolved_precision(device, precision, kind)
    if precision:
        properties["INFERENCE_PRECISION_HINT"] = precision
    if family == "CPU":
        groups = _activation_groups(activation_quantization)
        properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(groups)
        properties.update(int8_input_properties(kind))
        if threads:
            properties["INFERENCE_NUM_THREADS"] = str(threads)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        properties["CACHE_DIR"] = str(cache_dir)
    return properties


def int8_input_properties(kind: CpuKind | None = None) -> dict[str, str]:
    """OpenVINO CPU properties for int8-input layers on the CPU `kind` (default: this one): none
    where it has int8 dot products, else those that run such layers in float on their int8 grids
    (`graphs.FLOAT_INT8_INPUTS`)."""
    return {} if (kind or this_cpu()).int8_dot_products else dict(FLOAT_INT8_INPUTS)


def resolved_precision(
    device: str, precision: str | None, kind: CpuKind | None = None
) -> str | None:
    """The precision a graph computes in on `device`: "auto" = bf16 on a CPU with native bf16;
    None (or "auto" elsewhere) = f32 on a CPU (named: OpenVINO's own CPU default is bf16 where
    the CPU has it), the device's default on GPU and NPU (None)."""
    cpu = device.split(".")[0] == "CPU"
    if precision == "auto" and cpu and (kind or this_cpu()).native_bf16:
        return "bf16"
    if precision in ("auto", None):
        return "f32" if cpu else None
    return precision


def arithmetic(
    ep: str, device: str, precision: str | None, int8_inputs: bool, kind: CpuKind | None = None
) -> str:
    """What a graph computes in, as `/health` and the start-up log say it: e.g. "bf16, int8
    inputs int8 x int8 (AVX-512 BF16 + AMX)", "f32, int8 inputs in float on their int8 grids
    (AVX2)". int8_inputs: the model's files have int8-input layers."""
    kind = kind or this_cpu()
    family = device.split(".")[0]
    if ep == "cpu":
        compute = "f32"
    else:
        compute = resolved_precision(device, precision, kind) or f"the {family} default"
    if not int8_inputs:
        return compute
    if ep == "openvino" and family != "CPU":
        return f"{compute}, int8 inputs as the {family} plugin runs them"
    how = "int8 x int8" if kind.int8_dot_products else "in float on their int8 grids"
    return f"{compute}, int8 inputs {how} ({kind.name})"


def open_graph(
    path: Path,
    ep: str,
    device: str,
    threads: int,
    cache_dir: Path | None = None,
    inference_precision: str | None = None,
    activation_quantization: str = "auto",
    bf16_ports: tuple[str, ...] = (),
    shrink_arena: bool = False,
) -> Graph:
    """A graph on OpenVINO (`ep="openvino"`, on `device`) or ONNX Runtime's CPU provider
    (`ep="cpu"`); `bf16_ports` (OpenVINO) are the inputs and outputs handed over as bf16;
    `shrink_arena` (ONNX Runtime; OpenVINO has no such arena): `OrtGraph`'s."""
    try:
        if ep == "cpu":
            int8 = this_cpu().int8_dot_products
            return OrtGraph(path, threads, float_int8_inputs=not int8, shrink_arena=shrink_arena)
        properties = openvino_properties(
            device,
            inference_precision,
            activation_quantization,
            threads,
            cache_dir,
        )
        return OpenVINOGraph(path, device, properties, bf16_ports)
    except Exception as e:  # onnxruntime's Fail/InvalidProtobuf/... derive from Exception only
        raise DeviceError(f"cannot load {path.name} on {ep}/{device}: {e}") from e


class WhisperSessions:
    """The encoder and decoder graphs of one model folder; safe to call from many threads.
    Word timing (the "aligner" stage) runs on the decoder's graph: one copy of its weights.
    A graph whose weights are in an external data file has that file's mapped pages dropped
    after its first run (`mapped_weights`).

    K/V travel in the precision the decoder computes in (`kv_dtype`): bf16 (`graphs.BF16` arrays)
    where it computes bf16 on OpenVINO's CPU, else f32. The encoder writes the cross K/V so once
    per window, and the self K/V go in and come out so, so no decoder step converts them (at
    beam 5 on tiny.en that reorder of the past was ~1.3 of a 6 ms step)."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        encoder: Graph,
        decoder: Graph,
        devices: dict[str, str],
        ep: str,
        kv_dtype: np.dtype,
        arithmetic: dict[str, str],
    ) -> None:
        self.folder = folder
        self.manifest = manifest
        self.devices = devices
        self.arithmetic = arithmetic
        self.ep = ep
        self.kv_dtype = kv_dtype
        self._encoder = encoder
        self._decoder = decoder
        n_layers = manifest.dims.n_text_layer
        self._encoder_outputs = contract.encoder_output_names(n_layers)
        self._step_outputs = contract.decoder_step_output_names(n_layers)
        self._past_names = contract.past_names(n_layers)
        self._cross_names = contract.encoder_output_names(n_layers)
        self._unreleased = {
            stage: data
            for stage in ("encoder", "decoder")
            if (data := folder / f"{stage}.onnx.data").is_file()
        }

    def _ran(self, stage: str) -> None:
        """After a stage's first run its weights are packed: drop the mapped originals."""
        data = self._unreleased.pop(stage, None)
        if data is not None:
            advised_mb = mapped_weights.release([data]) >> 20
            log.info("%s/%s: released %d MB of mapped weights", self.folder.name, stage, advised_mb)

    @classmethod
    def load(cls, folder: Path, options: RuntimeOptions | None = None) -> WhisperSessions:
        options = options or RuntimeOptions()
        folder = Path(folder)
        manifest = Manifest.load(folder)
        missing = contract.missing_files(folder)
        if missing:
            raise ContractError(f"{folder} lacks {', '.join(missing)}: rebuild the model")
        available = openvino_devices() if options.ep == "openvino" else []
        devices = {"encoder": "CPU", "decoder": "CPU"}
        if options.ep == "openvino":
            for stage in devices:
                wanted = getattr(options, f"{stage}_device") or options.device
                devices[stage] = resolve_device(wanted, available)
        n_layers = manifest.dims.n_text_layer
        kv_names = {
            "encoder": tuple(contract.encoder_output_names(n_layers)),
            "decoder": (
                *contract.encoder_output_names(n_layers),
                *contract.past_names(n_layers),
                *contract.decoder_step_output_names(n_layers)[1:],
            ),
        }
        bf16_kv = (
            options.ep == "openvino"
            and devices["decoder"].split(".")[0] == "CPU"
            and resolved_precision(devices["decoder"], options.inference_precision) == "bf16"
        )
        graphs: dict[str, Graph] = {}
        computes: dict[str, str] = {}
        for stage in ("encoder", "decoder"):
            started = time.perf_counter()
            graph = open_graph(
                folder / f"{stage}.onnx",
                options.ep,
                devices[stage],
                options.threads,
                options.cache_dir,
                options.inference_precision,
                activation_quantization=options.activation_quantization,
                bf16_ports=kv_names[stage] if bf16_kv else (),
            )
            contract.check_io(
                stage, graph.input_names, graph.output_names, manifest.dims.n_text_layer
            )
            log.info(
                "loaded %s/%s on %s/%s in %.2f s",
                folder.name,
                stage,
                options.ep,
                devices[stage],
                time.perf_counter() - started,
            )
            graphs[stage] = graph
            computes[stage] = arithmetic(
                options.ep,
                devices[stage],
                options.inference_precision,
                int8_inputs=manifest.precision == "int8",
            )
            log.info("%s/%s computes in %s", folder.name, stage, computes[stage])
        devices["aligner"] = devices["decoder"]  # word timing runs on the decoder's graph
        computes["aligner"] = computes["decoder"]
        kv_dtype = BF16 if bf16_kv else np.dtype(np.float32)
        return cls(
            folder,
            manifest,
            graphs["encoder"],
            graphs["decoder"],
            devices,
            options.ep,
            kv_dtype,
            computes,
        )

    @property
    def providers(self) -> dict[str, str]:
        """What runs each stage: "OpenVINO" or ONNX Runtime's "CPUExecutionProvider" (the
        aligner stage is the decoder's graph)."""
        decoder = self._decoder.provider
        return {"encoder": self._encoder.provider, "decoder": decoder, "aligner": decoder}

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """features f32 [B, n_mels, 3000] -> [cross_k_0, cross_v_0, ...], each [B, H, 1500, Dh]
        of `kv_dtype`."""
        cross = self._encoder.run(self._encoder_outputs, {"input_features": features})
        self._ran("encoder")
        return cross

    def encode_into(self, features: np.ndarray, outputs: list[np.ndarray]) -> None:
        """`encode`, its outputs written into `outputs` (`kv_dtype`, C-contiguous, [B, H, 1500,
        Dh] each, e.g. slots of a slab) instead of arrays allocated per call: a fresh window's
        9-61 MB of cross K/V would be page-faulted in on every call (base: ~9000 faults, ~46 ms
        on a VM)."""
        for name, out in zip(self._encoder_outputs, outputs, strict=True):
            assert out.dtype == self.kv_dtype and out.flags.c_contiguous, name
        features = np.ascontiguousarray(features, np.float32)
        self._encoder.run_into(
            {"input_features": features}, dict(zip(self._encoder_outputs, outputs, strict=True))
        )
        self._ran("encoder")

    def decode(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        cross: list[np.ndarray],
        logits_at: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder call (shapes in contract.decoder_input_names; K/V of `kv_dtype`); returns
        logits f32 [B, K, V] at the new positions `logits_at` i64 [K] (None: all T of them),
        new K/V of `kv_dtype`."""
        feed = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
            contract.LOGITS_AT: every_position(input_ids) if logits_at is None else logits_at,
        }
        feed.update(zip(self._past_names, past, strict=True))
        feed.update(zip(self._cross_names, cross, strict=True))
        logits, *new = self._decoder.run(self._step_outputs, feed)
        self._ran("decoder")
        return logits, new

    def run_steps(self, steps: Steps[T]) -> T:
        """A resumable decode served here, one decoder call per step."""
        return serve_steps(steps, self.decode)

    def align(
        self, input_ids: np.ndarray, target_ids: np.ndarray, cross: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Word timing over whole token rows, a decoder prefill from position 0: input_ids,
        target_ids i64 [B, T] (target < eot), cross K/V with B rows -> the alignment heads'
        weights f32 [B, A, T, 1500], log p(target) over the text tokens f32 [B, T]."""
        batch, n_tokens = input_ids.shape
        positions = np.broadcast_to(np.arange(n_tokens, dtype=np.int64), (batch, n_tokens))
        feed = {
            "input_ids": input_ids,
            "position_ids": np.ascontiguousarray(positions),
            "attention_mask": np.ones((batch, n_tokens), np.int64),
            contract.LOGITS_AT: every_position(input_ids),
        }
        feed.update(zip(self._past_names, self.empty_past(batch), strict=True))
        feed.update(zip(self._cross_names, cross, strict=True))
        logits, queries = self._decoder.run(["logits", contract.ALIGNMENT_QUERIES], feed)
        self._ran("decoder")
        manifest = self.manifest
        return (
            alignment.alignment_weights(queries, cross, manifest.alignment_heads),
            alignment.token_logprobs(logits, target_ids, manifest.special.eot),
        )

    def empty_past(self, batch: int = 1) -> list[np.ndarray]:
        """Zero-length self K/V [batch, H, 0, Dh] for a first call with nothing cached."""
        dims = self.manifest.dims
        shape = (batch, dims.n_heads, 0, dims.head_dim)
        return [np.zeros(shape, self.kv_dtype) for _ in self._past_names]


def every_position(input_ids: np.ndarray) -> np.ndarray:
    """`logits_at` for logits at all T new positions of input_ids [B, T]."""
    return np.arange(input_ids.shape[1], dtype=np.int64)
