"""Whisper weights in numpy, keyed by Hugging Face names, whatever file format they came from."""

from __future__ import annotations

import re
from dataclasses import dataclass

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
