"""The peer on our own runtime: openvino.genai's `WhisperPipeline` on the very weights our graphs
are built from, exported as its authors intend (optimum-intel, int8 weights, stateful decoder).

Three steps, once per model, into `.cache/genai/<name>/`:
1. `hf/`: the catalog package's CTranslate2 weights as a Transformers checkpoint — the test
   oracle's `WhisperForConditionalGeneration` (fp32, tied output projection) saved with the
   package's tokenizer.json and a generation config made from the package's config.json
   (suppress lists, alignment heads, language ids);
2. `ov/`: `optimum-cli export openvino --task automatic-speech-recognition-with-past
   --weight-format int8` in `.venv-genai` (`make bench-genai-setup`), which also converts the
   tokenizer with openvino-tokenizers;
3. a check that the pipeline reads jfk right.

    .venv/bin/python -m benchmarks.genai_model --models tiny.en,base
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from benchmarks import common


def generation_config(ct2_config: dict, tokenizer: dict, multilingual: bool) -> dict:
    """generation_config.json as the hub's Whisper repositories have it, from the package's
    CTranslate2 config.json (which CTranslate2's converter wrote from that very file)."""
    ids = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    eot, sot = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    config = {
        "decoder_start_token_id": sot,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "pad_token_id": eot,
        "no_timestamps_token_id": ids["<|notimestamps|>"],
        "prev_sot_token_id": ids["<|startofprev|>"],
        "is_multilingual": multilingual,
        "max_length": 448,
        "max_initial_timestamp_index": 50,
        "suppress_tokens": ct2_config["suppress_ids"],
        "begin_suppress_tokens": ct2_config["suppress_ids_begin"],
        "alignment_heads": ct2_config["alignment_heads"],
    }
    if multilingual:
        names = {i: t for t, i in ids.items()}
        config["lang_to_id"] = {names[i]: i for i in ct2_config["lang_ids"]}
        config["task_to_id"] = {t: ids[f"<|{t}|>"] for t in ("transcribe", "translate")}
    return config


def write_hf(name: str, target: Path) -> Path:
    from transformers import WhisperFeatureExtractor, WhisperTokenizerFast

    from app.export.sources import fetch_catalog_model
    from tests.oracle import build_reference, reference_ids

    source = fetch_catalog_model(name, common.WEIGHTS_CACHE)
    weights = source.load_weights()
    model = build_reference(weights)
    tokenizer = json.loads(source.tokenizer.read_text())
    ct2_config = json.loads((common.peer_model_dir(name) / "config.json").read_text())
    from transformers import GenerationConfig

    model.generation_config = GenerationConfig(
        **generation_config(ct2_config, tokenizer, reference_ids(weights.dims()).multilingual)
    )
    partial = target.with_suffix(".tmp")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial, safe_serialization=True)
    fast = WhisperTokenizerFast(tokenizer_file=str(source.tokenizer))
    fast.save_pretrained(partial)
    WhisperFeatureExtractor(feature_size=weights.dims().n_mels).save_pretrained(partial)
    partial.replace(target)
    return target


def export(name: str) -> Path:
    """`.cache/genai/<name>/ov`, made once."""
    folder = common.GENAI_CACHE / name
    ov = folder / "ov"
    if (ov / "openvino_decoder_model.xml").is_file():
        return ov
    if not common.GENAI_PYTHON.is_file():
        raise SystemExit("the openvino.genai venv is missing: run `make bench-genai-setup`")
    folder.mkdir(parents=True, exist_ok=True)
    hf = folder / "hf"
    if not (hf / "config.json").is_file():
        write_hf(name, hf)
    partial = folder / "ov.tmp"
    shutil.rmtree(partial, ignore_errors=True)
    cli = common.GENAI_PYTHON.parent / "optimum-cli"
    subprocess.run(
        [str(cli), "export", "openvino", "--model", str(hf), "--task",
         "automatic-speech-recognition-with-past", "--weight-format", "int8", str(partial)],
        check=True,
    )  # fmt: skip
    partial.replace(ov)
    return ov


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny.en,base")
    args = p.parse_args()
    for name in args.models.split(","):
        ov = export(name)
        worker = common.Worker(name, common.CONFIGS["genai-int8"], threads=2)
        try:
            text = worker.transcribe(common.JFK, 1)["text"]
        finally:
            worker.close()
        print(f"{name}: {ov}\n  jfk: {text}")


if __name__ == "__main__":
    main()
