"""The graphs of one model folder, placed on devices by an explicit policy (`placement`).

`ep="openvino"`: OpenVINO's own runtime, on AUTO | NPU | GPU | CPU; `ep="cpu"`: ONNX Runtime's
CPU provider, the reference. See `graphs`.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

import numpy as np

from app.runtime import alignment, contract, mapped_weights
from app.runtime.contract import ContractError, Manifest
from app.runtime.graphs import BF16, Graph, is_static
from app.runtime.placement import (
    RuntimeOptions,
    arithmetic,
    available_devices,
    open_graph,
    resolve_device,
    resolved_precision,
)
from app.runtime.steps import Steps, serve_steps

log = logging.getLogger(__name__)
T = TypeVar("T")
OV_CACHE_FOLDER = ".ov-cache"  # beside the model folders: compiled graphs of static devices


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
        available = available_devices(options) if options.ep == "openvino" else []
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
        static_shapes = contract.static_feed_shapes(
            manifest.dims, options.static_rows, options.static_batch_rows
        )
        graphs: dict[str, Graph] = {}
        computes: dict[str, str] = {}
        for stage in ("encoder", "decoder"):
            started = time.perf_counter()
            static = options.ep == "openvino" and is_static(devices[stage])
            # a static device compiles at load: its compiled graphs are kept for the next start
            cache_dir = options.cache_dir or (folder.parent / OV_CACHE_FOLDER if static else None)
            graph = open_graph(
                folder / f"{stage}.onnx",
                options.ep,
                devices[stage],
                options.threads,
                cache_dir,
                options.inference_precision,
                activation_quantization=options.activation_quantization,
                bf16_ports=kv_names[stage] if bf16_kv else (),
                static_shapes=static_shapes[stage] if static else (),
                npu_emulation=options.npu_emulation,
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
                npu_emulation=options.npu_emulation,
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
    def static(self) -> bool:
        """The decoder runs on a device that compiles fixed shapes only (NPU): decodes use the
        static cache, whose shapes it compiled at load."""
        return self.ep == "openvino" and is_static(self.devices["decoder"])

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
        """A resumable task served here, in this thread, one call at a time."""
        return serve_steps(steps, self)

    def start(self, steps: Steps[T]) -> Future[T]:
        """`run_steps` now, in this thread; its outcome as a finished future."""
        future: Future[T] = Future()
        try:
            future.set_result(serve_steps(steps, self))
        except Exception as e:
            future.set_exception(e)
        return future

    def align(
        self, input_ids: np.ndarray, target_ids: np.ndarray, cross: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Word timing over whole token rows, a decoder prefill from position 0: input_ids,
        target_ids i64 [B, T] (target < eot), cross K/V with B rows -> the alignment heads'
        weights f32 [B, A, T, 1500], log p(target) over the text tokens f32 [B, T]. On a static
        device the rows run padded to n_text_ctx tokens (<|endoftext|>; attention is causal, so
        the first T positions' outputs are the same), the width compiled at load."""
        tokens = input_ids.shape[1]
        if self.static:
            width = self.manifest.dims.n_text_ctx
            input_ids = _pad_tokens(input_ids, width, self.manifest.special.eot)
            target_ids = _pad_tokens(target_ids, width, 0)
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
            alignment.alignment_weights(queries[:, :, :tokens], cross, manifest.alignment_heads),
            alignment.token_logprobs(logits[:, :tokens], target_ids[:, :tokens],
                                     manifest.special.eot),
        )  # fmt: skip

    def empty_past(self, batch: int = 1) -> list[np.ndarray]:
        """Zero-length self K/V [batch, H, 0, Dh] for a first call with nothing cached."""
        dims = self.manifest.dims
        shape = (batch, dims.n_heads, 0, dims.head_dim)
        return [np.zeros(shape, self.kv_dtype) for _ in self._past_names]


def _pad_tokens(ids: np.ndarray, width: int, value: int) -> np.ndarray:
    """Token rows i64 [B, T] filled out to [B, width] with `value`."""
    padded = np.full((ids.shape[0], width), value, np.int64)
    padded[:, : ids.shape[1]] = ids
    return padded


def every_position(input_ids: np.ndarray) -> np.ndarray:
    """`logits_at` for logits at all T new positions of input_ids [B, T]."""
    return np.arange(input_ids.shape[1], dtype=np.int64)
