"""ONNX Runtime sessions for one model folder, placed on devices by an explicit policy.

OpenVINO EP: `device_type` AUTO | NPU | GPU | CPU, with AUTO = NPU, else GPU, else CPU as OpenVINO
reports them. A device asked for by name that is missing is an error, never a silent CPU fallback
(the EP itself falls back silently, so the active providers are checked after creation).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.runtime import alignment, contract, mapped_weights
from app.runtime.contract import ContractError, Manifest

log = logging.getLogger(__name__)

EXECUTION_PROVIDERS = ("openvino", "cpu")
DEVICES = ("AUTO", "NPU", "GPU", "CPU")
_AUTO_ORDER = ("NPU", "GPU", "CPU")
_PROVIDER_NAMES = {"openvino": "OpenVINOExecutionProvider", "cpu": "CPUExecutionProvider"}


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
        "auto" = on where the CPU computes f32 with int8 dot products (VNNI/AMX), else off (see
        `_activation_groups`).
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


def openvino_devices() -> list[str]:
    """Devices OpenVINO reports on this machine, e.g. ['CPU', 'GPU.0', 'NPU']."""
    if "OpenVINOExecutionProvider" not in ort.get_available_providers():
        return []
    from onnxruntime.capi import _pybind_state

    return list(_pybind_state.get_available_openvino_device_ids())


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


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True when this CPU computes bf16 natively (AVX-512 BF16 or AMX), per /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def cpu_has_int8_dot_products() -> bool:
    """True when this CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX):
    OpenVINO CPU only quantizes activations with them (on an AVX2-only AMD EPYC, 2026-11-28, a
    decoder step's logits were bit for bit the same with it on and off)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_vnni|avx_vnni|amx_int8)\b", flags))


def _activation_groups(precision: str | None, activation_quantization: str) -> int:
    """OpenVINO CPU's `DYNAMIC_QUANTIZATION_GROUP_SIZE` for int8 weights (0 = off).

    Measured on a CPU without native bf16 (f32 compute, `benchmarks/results/decoder_state.md`):
    on, the int8 linear layers take 1.5 instead of 2.3 ms of a tiny.en step, the 60 s clip
    decodes 20-30 % faster with the same words, and a row's logits are the same bit for bit alone
    or packed with others (off: they differ by ~1e-5). Under bf16 (measured on a CPU with
    AVX-512 BF16) it gave no speed and the logits depend on the call's row count, so auto = off
    there. Without int8 dot products (AVX2 only) OpenVINO does not apply it: auto = off, so the
    settings say what runs (and a row's logits then differ by ~1e-5 with the rows beside it)."""
    if activation_quantization == "auto":
        exact = precision in ("bf16", "f16") or not cpu_has_int8_dot_products()
        activation_quantization = "off" if exact else "on"
    return ACTIVATION_GROUP if activation_quantization == "on" else 0


def _openvino_config(
    device: str,
    precision: str | None,
    inputs_feed_attention: bool,
    activation_quantization: str = "auto",
) -> dict:
    """OpenVINO plugin properties (`load_config`) for one graph on `device`."""
    family = device.split(".")[0]
    if precision == "auto":
        precision = "bf16" if family == "CPU" and cpu_has_native_bf16() else None
    properties: dict[str, str] = {}
    if precision:
        properties["INFERENCE_PRECISION_HINT"] = precision
    if family == "CPU":
        groups = _activation_groups(precision, activation_quantization)
        properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = str(groups)
    if family == "CPU" and precision == "bf16" and inputs_feed_attention:
        # OpenVINO 2025.4's fused-attention snippet rejects fp32 graph inputs (the past and cross
        # K/V) meeting bf16 activations ("BrgemmCPU node has incompatible input element types").
        properties["SNIPPETS_MODE"] = "DISABLE"
    if not properties:
        return {}
    return {family: properties}


def create_session(
    path: Path,
    ep: str,
    device: str,
    threads: int,
    cache_dir: Path | None = None,
    inference_precision: str | None = None,
    graph_inputs_feed_attention: bool = False,
    activation_quantization: str = "auto",
) -> ort.InferenceSession:
    """A session whose active provider is checked to be the one asked for."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if ep == "cpu":
        providers: list = ["CPUExecutionProvider"]
    else:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        # ONNX Runtime only allocates the graph's outputs here; its arena would keep the largest
        # ever made (a window's cross K/V, word timing's logits) reserved for good. Without it
        # they are freed: large-v3-turbo's encoder -58 MB after its outputs are dropped, the
        # decoder step no slower (benchmarks/results/memory_sizes.md).
        options.enable_cpu_mem_arena = False
        # OpenVINO optimizes the graph itself; ONNX Runtime's constant folding would first turn
        # fp16 weights into fp32 copies (measured: +120 MB peak for tiny.en, +360 MB for base).
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        ov_options = {"device_type": device}
        if threads:
            ov_options["num_of_threads"] = str(threads)
        if cache_dir is not None:
            Path(cache_dir).mkdir(parents=True, exist_ok=True)
            ov_options["cache_dir"] = str(cache_dir)
        config = _openvino_config(
            device, inference_precision, graph_inputs_feed_attention, activation_quantization
        )
        if config:
            ov_options["load_config"] = json.dumps(config)
        providers = [("OpenVINOExecutionProvider", ov_options)]
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
    except Exception as e:  # onnxruntime raises its own Fail/InvalidGraph/... types
        raise DeviceError(f"cannot load {path.name} on {ep}/{device}: {e}") from e
    active = session.get_providers()[0]
    if active != _PROVIDER_NAMES[ep]:
        raise DeviceError(f"{path.name} asked for {_PROVIDER_NAMES[ep]} ({device}), got {active}")
    return session


class WhisperSessions:
    """The encoder and decoder sessions of one model folder; safe to call from many threads.
    Word timing (the "aligner" stage) runs on the decoder's session: one copy of its weights.
    A graph whose weights are in an external data file has that file's mapped pages dropped
    after its first run (`mapped_weights`)."""

    def __init__(
        self,
        folder: Path,
        manifest: Manifest,
        encoder: ort.InferenceSession,
        decoder: ort.InferenceSession,
        devices: dict[str, str],
        ep: str,
    ) -> None:
        self.folder = folder
        self.manifest = manifest
        self.devices = devices
        self.ep = ep
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
        devices: dict[str, str] = {}
        sessions: dict[str, ort.InferenceSession] = {}
        available = openvino_devices() if options.ep == "openvino" else []
        if options.ep == "openvino" and not available:
            raise DeviceError("the OpenVINO execution provider is not installed in this Python")
        for stage in ("encoder", "decoder"):
            wanted = getattr(options, f"{stage}_device") or options.device
            device = resolve_device(wanted, available) if options.ep == "openvino" else "CPU"
            started = time.perf_counter()
            session = create_session(
                folder / f"{stage}.onnx",
                options.ep,
                device,
                options.threads,
                options.cache_dir,
                options.inference_precision,
                graph_inputs_feed_attention=stage != "encoder",
                activation_quantization=options.activation_quantization,
            )
            contract.check_io(
                stage,
                [i.name for i in session.get_inputs()],
                [o.name for o in session.get_outputs()],
                manifest.dims.n_text_layer,
            )
            log.info(
                "loaded %s/%s on %s/%s in %.2f s",
                folder.name,
                stage,
                options.ep,
                device,
                time.perf_counter() - started,
            )
            sessions[stage], devices[stage] = session, device
        devices["aligner"] = devices["decoder"]  # word timing runs on the decoder's session
        return cls(folder, manifest, sessions["encoder"], sessions["decoder"], devices, options.ep)

    @property
    def providers(self) -> dict[str, str]:
        """The active execution provider of each stage, e.g. {"encoder": "CPUExecutionProvider"}
        (the aligner stage is the decoder's session)."""
        decoder = self._decoder.get_providers()[0]
        return {"encoder": self._encoder.get_providers()[0], "decoder": decoder, "aligner": decoder}

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """features f32 [B, n_mels, 3000] -> [cross_k_0, cross_v_0, ...], each [B, H, 1500, Dh]."""
        cross = self._encoder.run(self._encoder_outputs, {"input_features": features})
        self._ran("encoder")
        return cross

    def encode_into(self, features: np.ndarray, outputs: list[np.ndarray]) -> None:
        """`encode`, its outputs written into `outputs` (f32 C-contiguous, [B, H, 1500, Dh] each,
        e.g. slots of a slab) instead of arrays allocated per call: a fresh window's 18-61 MB of
        cross K/V would be page-faulted in on every call (base: ~9000 faults, ~46 ms on a VM)."""
        binding = self._encoder.io_binding()
        binding.bind_cpu_input("input_features", np.ascontiguousarray(features, np.float32))
        for name, out in zip(self._encoder_outputs, outputs, strict=True):
            assert out.dtype == np.float32 and out.flags.c_contiguous, name
            binding.bind_output(name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        self._encoder.run_with_iobinding(binding)
        self._ran("encoder")

    def decode(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        cross: list[np.ndarray],
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder call (shapes in contract.decoder_input_names); returns logits, new K/V."""
        feed = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "attention_mask": attention_mask,
        }
        feed.update(zip(self._past_names, past, strict=True))
        feed.update(zip(self._cross_names, cross, strict=True))
        logits, *new = self._decoder.run(self._step_outputs, feed)
        self._ran("decoder")
        return logits, new

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
        return [np.zeros(shape, np.float32) for _ in self._past_names]
