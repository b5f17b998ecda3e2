"""The model-folder contract between `app.export` (writer) and the runtime (reader).

ONNX input/output names are generated here from the layer count, and nowhere else.
A model folder holds `encoder.onnx`, `decoder.onnx` (which also gives word timing's alignment
queries), their weights files `<graph>.onnx.data`, `tokenizer.json` and `manifest.json`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

# 2: aligner.onnx; 3: no aligner.onnx, the decoder's alignment_queries; 4: the decoder's
# logits only at the positions `logits_at` names
CONTRACT_VERSION = 4
MODEL_FILES = ("encoder.onnx", "decoder.onnx", "tokenizer.json", "manifest.json")

N_SAMPLES_PER_WINDOW = 480_000  # 30 s at 16 kHz
N_FRAMES = 3000  # mel frames per 30 s window (hop 160)
SAMPLE_RATE = 16_000
TIME_PRECISION = 0.02  # seconds per timestamp token and per encoder frame (30 s / 1500)
ALIGNMENT_QUERIES = "alignment_queries"  # the decoder's output for word timing
LOGITS_AT = "logits_at"  # the decoder's input: which new positions get logits
STATIC_PREFILL = 32  # tokens per call of a prompt on the static cache (the last chunk padded)


def missing_files(folder: Path) -> list[str]:
    """The contract's files that `folder` lacks, and the external weights files (`*.onnx.data`,
    every graph's weights) its manifest lists (empty for a complete model folder)."""
    folder = Path(folder)
    return [f for f in (*MODEL_FILES, *_external_data(folder)) if not (folder / f).is_file()]


def _external_data(folder: Path) -> list[str]:
    """The `*.data` files the manifest's sha256 list names (none without a readable manifest)."""
    try:
        hashes = json.loads((folder / "manifest.json").read_text()).get("sha256", {})
    except (OSError, ValueError, AttributeError):
        return []
    return [name for name in hashes if isinstance(name, str) and name.endswith(".data")]


class ContractError(RuntimeError):
    """A model folder does not match the contract this code was written for."""


def encoder_input_names() -> list[str]:
    return ["input_features"]


def encoder_output_names(n_layers: int) -> list[str]:
    """`cross_k_{i}`, `cross_v_{i}` [B, H, n_audio_ctx, Dh] for each decoder layer."""
    return [f"cross_{kind}_{i}" for i in range(n_layers) for kind in ("k", "v")]


def past_names(n_layers: int) -> list[str]:
    return [f"past_{kind}_{i}" for i in range(n_layers) for kind in ("k", "v")]


def decoder_input_names(n_layers: int) -> list[str]:
    """input_ids, position_ids [B, T]; attention_mask [B, P+T]; logits_at [K] (indices into the
    T new positions); past [B, H, P, Dh]; cross."""
    return [
        "input_ids",
        "position_ids",
        "attention_mask",
        LOGITS_AT,
        *past_names(n_layers),
        *encoder_output_names(n_layers),
    ]


def decoder_step_output_names(n_layers: int) -> list[str]:
    """logits [B, K, V] at the `logits_at` positions; `new_k_{i}`, `new_v_{i}` [B, H, T, Dh] for
    the T new positions only."""
    return ["logits", *(f"new_{kind}_{i}" for i in range(n_layers) for kind in ("k", "v"))]


def decoder_output_names(n_layers: int) -> list[str]:
    """The step's outputs, then `alignment_queries` [B, A, T, Dh]: the cross-attention queries
    (unscaled) of the manifest's alignment heads, in its order (word timing)."""
    return [*decoder_step_output_names(n_layers), ALIGNMENT_QUERIES]


def static_feed_shapes(
    dims: Dims, rows: Sequence[int], batch_rows: Sequence[int] = ()
) -> dict[str, list[dict[str, tuple]]]:
    """Per graph, the feeds' shapes a device that compiles fixed shapes only (NPU) compiles at
    load, so no request compiles: the encoder's one window; the decoder's static-cache step
    (one new token, the past and `attention_mask` over all n_text_ctx slots) at each row count
    of `rows` over one window's cross K/V (broadcast over its beams or samples), and at each of
    `batch_rows` over as many windows (a batched step: a row per window); a prompt's chunk of
    `STATIC_PREFILL` tokens at one row (logits at two of them); word timing's prefill of one
    n_text_ctx-token row from position 0 (logits at every position, an empty past)."""
    heads, dh, ctx = dims.n_heads, dims.head_dim, dims.n_text_ctx
    layers = dims.n_text_layer

    def decoder(
        batch: int, new: int, past: int, windows: int = 1, picked: int = 1
    ) -> dict[str, tuple]:
        return {
            "input_ids": (batch, new),
            "position_ids": (batch, new),
            "attention_mask": (batch, past + new),
            LOGITS_AT: (picked,),
            **{name: (batch, heads, past, dh) for name in past_names(layers)},
            **{
                name: (windows, heads, dims.n_audio_ctx, dh)
                for name in encoder_output_names(layers)
            },
        }

    return {
        "encoder": [{"input_features": (1, dims.n_mels, N_FRAMES)}],
        "decoder": [
            *(decoder(r, 1, ctx) for r in rows),
            *(decoder(r, 1, ctx, windows=r) for r in batch_rows),
            decoder(1, STATIC_PREFILL, ctx, picked=2),
            decoder(1, ctx, 0, picked=ctx),
        ],
    }


@dataclass(frozen=True)
class Dims:
    n_mels: int
    n_audio_ctx: int
    n_audio_layer: int
    n_text_ctx: int
    n_text_layer: int
    d_model: int
    n_heads: int
    n_vocab: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class SpecialTokens:
    eot: int
    sot: int
    translate: int
    transcribe: int
    sot_lm: int
    sot_prev: int
    no_speech: int
    no_timestamps: int
    timestamp_begin: int  # id of <|0.00|>; timestamp i is timestamp_begin + i (0.02 s steps)


@dataclass(frozen=True)
class Manifest:
    """What `manifest.json` says about a model folder."""

    name: str
    dims: Dims
    special: SpecialTokens
    multilingual: bool
    language_ids: dict[str, int]  # language code -> token id, e.g. "en" -> 50259
    suppress_ids: tuple[int, ...]
    suppress_ids_begin: tuple[int, ...]
    alignment_heads: tuple[tuple[int, int], ...]
    precision: str
    source: dict
    sha256: dict[str, str] = field(default_factory=dict)
    contract_version: int = CONTRACT_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> Manifest:
        version = data.get("contract_version")
        if version != CONTRACT_VERSION:
            raise ContractError(
                f"manifest contract version {version!r}, this code reads version "
                f"{CONTRACT_VERSION}; rebuild the model with `make models`"
            )
        try:
            return cls(
                name=data["name"],
                dims=Dims(**data["dims"]),
                special=SpecialTokens(**data["special"]),
                multilingual=bool(data["multilingual"]),
                language_ids=dict(data["language_ids"]),
                suppress_ids=tuple(data["suppress_ids"]),
                suppress_ids_begin=tuple(data["suppress_ids_begin"]),
                alignment_heads=tuple(tuple(h) for h in data["alignment_heads"]),
                precision=data["precision"],
                source=dict(data["source"]),
                sha256=dict(data.get("sha256", {})),
                contract_version=version,
            )
        except (KeyError, TypeError) as e:
            raise ContractError(f"manifest.json is missing or has a bad field: {e}") from e

    @classmethod
    def load(cls, folder: Path) -> Manifest:
        path = Path(folder) / "manifest.json"
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as e:
            raise ContractError(f"{folder} is not a model folder: no manifest.json") from e
        except json.JSONDecodeError as e:
            raise ContractError(f"{path} is not valid JSON: {e}") from e
        return cls.from_dict(data)


def check_io(kind: str, actual_inputs: list[str], actual_outputs: list[str], n_layers: int) -> None:
    """Raise ContractError when a session's I/O names differ from the contract's."""
    if kind == "encoder":
        want_in, want_out = encoder_input_names(), encoder_output_names(n_layers)
    else:
        want_in, want_out = decoder_input_names(n_layers), decoder_output_names(n_layers)
    for what, want, got in (
        ("inputs", want_in, actual_inputs),
        ("outputs", want_out, actual_outputs),
    ):
        if sorted(want) != sorted(got):
            missing = sorted(set(want) - set(got))
            extra = sorted(set(got) - set(want))
            raise ContractError(
                f"{kind}.onnx {what} do not match the contract: "
                f"missing {missing}, unexpected {extra}"
            )
