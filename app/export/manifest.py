"""The manifest of a built model: dims, special tokens and language ids read off the tokenizer,
which must fit the weights' vocabulary."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.export.errors import BuildError
from app.export.sources import GenerationConfig
from app.runtime.contract import Dims, Manifest, SpecialTokens

_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")
_TIMESTAMP_TOKEN = re.compile(r"^<\|\d+\.\d\d\|>$")
N_TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>, right after <|notimestamps|>
MULTILINGUAL_VOCAB = 51865  # openai/whisper: a vocabulary this large or larger is multilingual


def _tokenizer_ids(tokenizer_json: Path) -> tuple[dict[str, int], int]:
    """The added (special) tokens' ids by content, and the tokenizer's size (largest id + 1 over
    the BPE vocabulary and the added tokens)."""
    try:
        data = json.loads(tokenizer_json.read_text())
        added = {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}
        vocab = data.get("model", {}).get("vocab", {})
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BuildError(f"cannot read {tokenizer_json}: {e}") from e
    ids = [*added.values(), *(vocab.values() if isinstance(vocab, dict) else ())]
    return added, 1 + max(ids, default=-1)


def _check_fits(name: str, size: int, ids: dict[str, int], no_timestamps: int, n_vocab: int):
    """Raise BuildError unless the tokenizer describes exactly the weights' `n_vocab` tokens: its
    own tokens end at <|notimestamps|>, the 1501 timestamp tokens follow (listed or not)."""
    with_timestamps = no_timestamps + 1 + N_TIMESTAMPS
    listed = [t for c, t in ids.items() if _TIMESTAMP_TOKEN.match(c)]
    beyond = size - (no_timestamps + 1) - len(listed)
    if with_timestamps != n_vocab or size > with_timestamps or beyond > 0:
        raise BuildError(
            f"{name} does not fit the weights: it describes a vocabulary of {with_timestamps} "
            f"tokens ({no_timestamps + 1} tokens up to <|notimestamps|> + {N_TIMESTAMPS} "
            f"timestamps; the file lists {size}), the weights' token embedding has {n_vocab} "
            f"rows; use the tokenizer.json that belongs to these weights"
        )


def build_manifest(
    name: str,
    dims: Dims,
    tokenizer_json: Path,
    generation: GenerationConfig,
    precision: str,
    source: dict,
) -> Manifest:
    """Everything the runtime needs to know about the model besides its graphs.

    Raises BuildError when the tokenizer does not fit the weights' vocabulary (before any special
    token id is taken from it)."""
    ids, size = _tokenizer_ids(tokenizer_json)

    def token(*contents: str) -> int:
        for content in contents:
            if content in ids:
                return ids[content]
        raise BuildError(f"{tokenizer_json} lacks the special token {contents[0]}")

    no_timestamps = token("<|notimestamps|>")
    _check_fits(tokenizer_json.name, size, ids, no_timestamps, dims.n_vocab)
    sot = token("<|startoftranscript|>")
    translate = token("<|translate|>")
    languages = {
        m.group(1): token_id
        for content, token_id in ids.items()
        if sot < token_id < translate and (m := _LANGUAGE_TOKEN.match(content))
    }
    multilingual = dims.n_vocab >= MULTILINGUAL_VOCAB
    if not multilingual:
        languages = {code: i for code, i in languages.items() if code == "en"}
    return Manifest(
        name=name,
        dims=dims,
        special=SpecialTokens(
            eot=token("<|endoftext|>"),
            sot=sot,
            translate=translate,
            transcribe=token("<|transcribe|>"),
            sot_lm=token("<|startoflm|>"),
            sot_prev=token("<|startofprev|>"),
            no_speech=token("<|nospeech|>", "<|nocaptions|>"),
            no_timestamps=no_timestamps,
            timestamp_begin=no_timestamps + 1,
        ),
        multilingual=multilingual,
        language_ids=languages,
        suppress_ids=generation.suppress_ids,
        suppress_ids_begin=generation.suppress_ids_begin,
        alignment_heads=generation.alignment_heads or default_alignment_heads(dims),
        precision=precision,
        source=source,
    )


def default_alignment_heads(dims: Dims) -> tuple[tuple[int, int], ...]:
    """Weights that name no alignment heads (a generation config without them, a fine-tune):
    every head of the upper half of the text layers, openai/whisper's default."""
    return tuple(
        (layer, head)
        for layer in range(dims.n_text_layer // 2, dims.n_text_layer)
        for head in range(dims.n_heads)
    )
