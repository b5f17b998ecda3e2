"""The manifest of a built model: dims, special tokens and language ids read off the tokenizer."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.export.errors import BuildError
from app.export.sources import GenerationConfig
from app.runtime.contract import Dims, Manifest, SpecialTokens

_LANGUAGE_TOKEN = re.compile(r"^<\|([a-z]{2,3}|haw|yue)\|>$")


def _special_token_ids(tokenizer_json: Path) -> dict[str, int]:
    try:
        data = json.loads(tokenizer_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BuildError(f"cannot read {tokenizer_json}: {e}") from e
    return {t["content"]: t["id"] for t in data.get("added_tokens", [])}


def build_manifest(
    name: str,
    dims: Dims,
    tokenizer_json: Path,
    generation: GenerationConfig,
    precision: str,
    source: dict,
) -> Manifest:
    """Everything the runtime needs to know about the model besides its graphs."""
    ids = _special_token_ids(tokenizer_json)

    def token(*contents: str) -> int:
        for content in contents:
            if content in ids:
                return ids[content]
        raise BuildError(f"{tokenizer_json} lacks the special token {contents[0]}")

    no_timestamps = token("<|notimestamps|>")
    sot = token("<|startoftranscript|>")
    translate = token("<|translate|>")
    languages = {
        m.group(1): token_id
        for content, token_id in ids.items()
        if sot < token_id < translate and (m := _LANGUAGE_TOKEN.match(content))
    }
    multilingual = dims.n_vocab >= 51865
    if not multilingual:
        languages = {code: i for code, i in languages.items() if code == "en"}
    if dims.n_vocab <= no_timestamps:
        raise BuildError(f"vocabulary of {dims.n_vocab} has no room for timestamp tokens")
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
