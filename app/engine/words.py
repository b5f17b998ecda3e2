"""Words of text tokens: the one word type (`Word`, files and live streams) and the one word
split (`split_words`: the tokenizer's split, punctuation joined to its neighbour, as the aligner
gives them in `app.engine.timing`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.tokenizer import Tokenizer

PREPEND_PUNCTUATION = "\"'“¿([{-"
APPEND_PUNCTUATION = "\"'.。,，!！?？:：”)]}、"


@dataclass(frozen=True)
class Word:
    """One word: its text (with its leading space), its time span (seconds: from its window's
    start as the aligner gives it, from the audio's or the stream's start once placed) and
    probability (the mean of its tokens'; None when not aligned); its tokens and their
    log-probs (OpenAI's `include[]=logprobs`). peak: the latest frame (seconds, as its span)
    the alignment heads attended to most while its tokens were read, where in the audio the
    decoder was reading (AlignAtt's test; None without attention); segment: the index of its
    segment in its window."""

    start: float
    end: float
    word: str
    probability: float | None
    tokens: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    peak: float | None = None
    segment: int = 0

    @property
    def key(self) -> str:
        """The word normalised for comparison: lower case, letters and digits only."""
        kept = "".join(c for c in self.word.lower() if c.isalnum())
        return kept or self.word.strip().lower()


def split_words(tokenizer: Tokenizer, tokens: Sequence[int], language: str | None) -> list[Word]:
    """The words of text tokens as the aligner gives them, untimed: the tokenizer's split,
    punctuation joined to its neighbour. The one word split of the service (files and live)."""
    words, word_tokens = tokenizer.split_words(list(tokens), language)
    split = [Word(0.0, 0.0, w, None, tuple(t)) for w, t in zip(words, word_tokens, strict=True)]
    return join_punctuation(split)


def join_punctuation(words: Sequence[Word]) -> list[Word]:
    """Opening punctuation joins the word after it, closing punctuation the word before (the
    joined word keeps the other's times and probability); empty words are dropped."""
    words = list(words)
    following = len(words) - 1
    for i in range(len(words) - 2, -1, -1):
        word = words[i]
        if word.word.startswith(" ") and word.word.strip() in PREPEND_PUNCTUATION:
            words[following] = _joined(words[following], word, words[following])
            words[i] = replace(word, word="", tokens=())
        else:
            following = i
    previous = 0
    for i in range(1, len(words)):
        word, before = words[i], words[previous]
        if not before.word.endswith(" ") and word.word in APPEND_PUNCTUATION:
            words[previous] = _joined(before, before, word)
            words[i] = replace(word, word="", tokens=())
        else:
            previous = i
    return [w for w in words if w.word]


def _joined(keeper: Word, first: Word, second: Word) -> Word:
    """`keeper` spelled as `first` then `second` (their tokens, log-probs, the later peak)."""
    peaks = [p for p in (first.peak, second.peak) if p is not None]
    return replace(
        keeper,
        word=first.word + second.word,
        tokens=first.tokens + second.tokens,
        logprobs=first.logprobs + second.logprobs,
        peak=max(peaks) if len(peaks) == 2 else None,
    )
