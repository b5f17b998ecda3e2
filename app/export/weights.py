"""Whisper weights in numpy, keyed by Hugging Face names, whatever file format they came from."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.export.errors import BuildError
from app.runtime.contract import Dims


@dataclass(frozen=True)
class WhisperWeights:
    """`tensors` maps `WhisperForConditionalGeneration` state-dict names to arrays (fp16 or fp32).

    The output projection is tied to `model.decoder.embed_tokens.weight` and not stored twice.
    """

    tensors: dict[str, np.ndarray]
    n_heads: int

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.tensors[name]
        except KeyError as e:
            raise BuildError(f"the weights lack tensor {name}: not a complete Whisper model") from e

    def layer_count(self, stack: str) -> int:
        pattern = re.compile(rf"^model\.{stack}\.layers\.(\d+)\.")
        indices = [int(m.group(1)) for k in self.tensors if (m := pattern.match(k))]
        return 1 + max(indices, default=-1)

    def dims(self) -> Dims:
        embed = self["model.decoder.embed_tokens.weight"]  # [V, D]
        return Dims(
            n_mels=int(self["model.encoder.conv1.weight"].shape[1]),
            n_audio_ctx=int(self["model.encoder.embed_positions.weight"].shape[0]),
            n_audio_layer=self.layer_count("encoder"),
            n_text_ctx=int(self["model.decoder.embed_positions.weight"].shape[0]),
            n_text_layer=self.layer_count("decoder"),
            d_model=int(embed.shape[1]),
            n_heads=self.n_heads,
            n_vocab=int(embed.shape[0]),
        )


_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """The tensors of one `.safetensors` file (an 8-byte header length, a JSON header of dtype,
    shape and byte offsets, then the data): fp32 and fp16 as views on the file's bytes, bf16
    widened to fp32 (numpy has no bf16; the safetensors package cannot read it into numpy)."""
    try:
        raw = Path(path).read_bytes()
        length = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8 : 8 + length])
        body = memoryview(raw)[8 + length :]
        tensors: dict[str, np.ndarray] = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise BuildError(f"{name} is {info['dtype']}, not a float Whisper weight")
            start, end = info["data_offsets"]
            if end > len(body) or start > end:
                raise BuildError(f"{name} lies beyond the end of the file (truncated?)")
            array = np.frombuffer(body[start:end], dtype)
            if info["dtype"] == "BF16":
                array = (array.astype(np.uint32) << 16).view(np.float32)
            tensors[name] = array.reshape(info["shape"])
    except BuildError as e:
        raise BuildError(f"cannot read {Path(path).name}: {e}") from e
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise BuildError(f"cannot read {Path(path).name}: not a safetensors file ({e})") from e
    return tensors
