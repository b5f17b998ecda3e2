"""Which files of a folder or Hub repository make a Whisper model, decided from the file names.

Two layouts are read: Transformers (`config.json`, `tokenizer.json`, `model.safetensors` or the
shards `model-0000i-of-0000n.safetensors` with `model.safetensors.index.json`, and
`generation_config.json` when present) and CTranslate2 (`model.bin`, `tokenizer.json`,
`config.json` when present). Other files (PyTorch, TensorFlow, Flax weights, fp32 copies) are
never needed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.export.errors import BuildError

_SHARD = re.compile(r"^model-(\d{5})-of-(\d{5})\.safetensors$")
_CT2_PART = re.compile(r"^model\.bin\.part\d+$")
_OTHER_WEIGHTS = {
    "pytorch_model.bin": "PyTorch",
    "pytorch_model.bin.index.json": "PyTorch",
    "tf_model.h5": "TensorFlow",
    "flax_model.msgpack": "Flax",
}
_CT2_WHISPER_KEYS = ("suppress_ids", "suppress_ids_begin", "lang_ids", "alignment_heads")


@dataclass(frozen=True)
class Layout:
    """The files to read, relative to the folder or repository root."""

    format: Literal["hf", "ct2"]
    weights: tuple[str, ...]
    tokenizer: str = "tokenizer.json"
    config: str | None = "config.json"
    extras: tuple[str, ...] = ()  # generation_config.json, the shards' index

    @property
    def files(self) -> tuple[str, ...]:
        named = (self.config,) if self.config else ()
        return (*named, self.tokenizer, *self.extras, *self.weights)


def _shards(root: set[str], where: str) -> tuple[str, ...]:
    found = sorted(n for n in root if _SHARD.match(n))
    if not found:
        return ()
    count = int(_SHARD.match(found[0]).group(2))
    expected = [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]
    missing = [n for n in expected if n not in root]
    if missing or len(found) != count:
        raise BuildError(f"{where} has an incomplete set of weight shards: {missing or found}")
    if "model.safetensors.index.json" not in root:
        raise BuildError(f"{where} has weight shards but no model.safetensors.index.json")
    return tuple(expected)


def _require(root: set[str], names: Iterable[str], where: str, what: str) -> None:
    missing = [n for n in names if n not in root]
    if missing:
        raise BuildError(f"{where} holds {what} but lacks {', '.join(missing)}")


def _ct2(root: set[str], where: str) -> Layout | None:
    parts = sorted(n for n in root if _CT2_PART.match(n))
    if "model.bin" not in root and not parts:
        return None
    if "tokenizer.json" not in root:
        vocabulary = sorted(n for n in root if n.startswith("vocabulary."))
        hint = f" ({', '.join(vocabulary)} lacks the BPE merges)" if vocabulary else ""
        raise BuildError(
            f"{where} holds CTranslate2 Whisper weights but no tokenizer.json{hint}: "
            f"add the tokenizer.json of the Whisper model it was converted from"
        )
    return Layout(
        "ct2",
        ("model.bin",) if "model.bin" in root else tuple(parts),
        config="config.json" if "config.json" in root else None,
    )


def pick_layout(names: Iterable[str], where: str) -> Layout:
    """The layout of a folder or repository holding `names` (paths relative to its root).

    Transformers safetensors win over a CTranslate2 model.bin in the same place: they are the
    original precision, a CTranslate2 conversion may be int8.
    """
    root = {n for n in names if "/" not in n}
    weights = ("model.safetensors",) if "model.safetensors" in root else _shards(root, where)
    if weights:
        _require(root, ("config.json", "tokenizer.json"), where, "Transformers weights")
        extras = [n for n in ("generation_config.json",) if n in root]
        if len(weights) > 1:
            extras.append("model.safetensors.index.json")
        return Layout("hf", weights, extras=tuple(extras))
    if (layout := _ct2(root, where)) is not None:
        return layout
    other = sorted({kind for n, kind in _OTHER_WEIGHTS.items() if n in root})
    if other:
        raise BuildError(
            f"{where} holds only {' and '.join(other)} weights: this server reads safetensors "
            f"(Transformers layout) or CTranslate2 model.bin; use a repository that has them"
        )
    raise BuildError(
        f"{where} holds no Whisper weights: expected model.bin (CTranslate2) "
        f"or config.json + model.safetensors (Transformers)"
    )


def check_config(folder: Path, layout: Layout, where: str) -> None:
    """Refuse a config.json that describes something other than Whisper."""
    if layout.config is None:
        return
    try:
        config = json.loads((folder / layout.config).read_text())
    except (OSError, ValueError) as e:
        raise BuildError(f"{where}: cannot read {layout.config}: {e}") from e
    if not isinstance(config, dict):
        raise BuildError(f"{where}: {layout.config} is not a JSON object")
    if layout.format == "hf" and config.get("model_type") != "whisper":
        kind = config.get("model_type") or "unknown"
        raise BuildError(f"{where} is not a Whisper model: its config.json has model_type {kind!r}")
    if layout.format == "ct2" and not any(k in config for k in _CT2_WHISPER_KEYS):
        raise BuildError(
            f"{where} is not a CTranslate2 Whisper model: its config.json has none of "
            f"{', '.join(_CT2_WHISPER_KEYS)}"
        )
