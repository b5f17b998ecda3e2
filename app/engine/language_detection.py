"""Which language a window is in: the decoder's logits after `<|startoftranscript|>` alone,
over the language tokens (openai/whisper's `detect_language`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from app.engine.decoding_types import LanguageDetection
from app.engine.kv_cache import make_cache
from app.runtime.steps import Steps

if TYPE_CHECKING:
    from app.engine.backend import WhisperBackend
    from app.engine.tokenizer import Tokenizer


def detect_language(
    sessions: WhisperBackend,
    cross: list[np.ndarray],
    tokenizer: Tokenizer,
    kv_cache: str = "concat",
    candidates: Sequence[str] = (),
) -> LanguageDetection:
    """Language of one window from the decoder's logits after `<|startoftranscript|>` alone,
    restricted to the language tokens (one decoder call, T = 1); with `candidates` (language
    codes), to theirs: the most probable of them, probabilities over them. English-only: "en"."""
    return sessions.run_steps(language_steps(sessions, cross, tokenizer, kv_cache, candidates))


def language_steps(
    sessions: WhisperBackend,
    cross: list[np.ndarray],
    tokenizer: Tokenizer,
    kv_cache: str = "concat",
    candidates: Sequence[str] = (),
) -> Steps[LanguageDetection]:
    """`detect_language` as a resumable task (`app.runtime.steps`)."""
    if not tokenizer.multilingual:
        return LanguageDetection("en", 1.0, {"en": 1.0})
    codes = tuple(dict.fromkeys(candidates)) or tokenizer.language_codes
    ids = np.asarray([tokenizer.language_token(code) for code in codes], dtype=np.intp)
    cache = make_cache(kv_cache, sessions, cross, 1)
    tokens = np.array([[tokenizer.sot]], np.int64)
    logits = (yield from cache.forward_steps(tokens))[0, -1]  # [V]
    lang_logits = logits[ids].astype(np.float64)
    probs = np.exp(lang_logits - lang_logits.max())
    probs /= probs.sum()
    order = np.argsort(-probs, kind="stable")
    probabilities = {codes[i]: float(probs[i]) for i in order}
    best = codes[int(order[0])]
    return LanguageDetection(best, float(probs[order[0]]), probabilities)
