"""When a decoded word becomes final: the commit policies of a live stream.

Each pass decodes the whole buffer; its words after the committed ones are `new`. A policy says
how many of them to commit now (a prefix: committed text is append-only). Policies are pure:
words and times in, a count out; no audio, no model.

- `LocalAgreement` (LocalAgreement-2; Macháček et al. 2023, ufal/whisper_streaming): commit the
  longest prefix on which this pass and the previous one agree. Robust, but a word waits for a
  second pass that says it again: at least one step after it was first decoded.
- `AlignAtt` (Papi et al. 2023; Simul-Whisper 2024; ufal/SimulStreaming 2025): a word is safe
  once the decoder, while reading it, attended (alignment heads) to audio at least `edge_s`
  before the end of the buffer; the first word that looks at the edge stops the commit, since
  the audio after it may change it. One pass suffices, so words come out a step earlier. A
  word without attention (`peak` None) is never safe, nor is the pass's last word: nothing
  after it shows that it is whole (Whisper reads "you" where more audio makes "your"). Nor,
  on one pass alone, is the word just before the first unsafe one (or before the last word):
  the unsettled word may take it along when it is read again ("What you are country" where the
  next pass reads "What your country"), so it commits once two passes read it, unless the
  decoder read it sure (`REREAD_BELOW`: of 956 such words held on 162 clips, tiny.en and base,
  the 14 the next pass read otherwise had p 0.03-0.85; holding the sure ones too cost ~0.2 s
  of median lag). Nor does the first reading of new speech commit alone (nothing pending: the
  stream's start, after a pause or a cut): read on the little audio after a cut, an
  utterance's first words are read most variably ("Watch your country", "What you are
  country" where a loaded server's pass fell), so they wait for the next pass. A word the
  decoder read with low probability inside a
  sentence waits, in addition, for the next pass to read it again: one pass may fall at a
  buffer length where Whisper reads it otherwise.

Neither policy ends a commit inside a written word: a word whose successor is glued to it (the
successor starts with a hyphen or another opening mark, no space: "pound" "-demic") is only
committed with it, since the rest may change how its start is read ("pandemic" a pass later).

At a pause or a client commit the session commits everything, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from app.engine.words import PREPEND_PUNCTUATION, Word
from app.service.live.bounds import EDGE_S

SURE = 0.5  # a word read with a lower probability is unsure (see AlignAtt)
REREAD_BELOW = 0.9  # the word before an unsettled one, read less sure, waits for a second pass
SENTENCE_END = (".", "!", "?")
TRAILING = ("...", "…")  # Whisper's "the speech goes on" at the end of its audio


def ends_sentence(text: str) -> bool:
    """The text ends a sentence: a period, question or exclamation mark, not an ellipsis."""
    text = text.rstrip()
    return text.endswith(SENTENCE_END) and not text.endswith(TRAILING)


def unsure(word: Word, sure: float = SURE) -> bool:
    return word.probability is not None and word.probability < sure


def in_doubt(words: Sequence[Word], before: Word | None, sure: float = SURE) -> list[bool]:
    """Per word of `words` (which follow `before`, None at the stream's start): read unsure
    inside a sentence. A sentence's first word is not in doubt: its low probability is how the
    sentence starts ("And" or "and", a filler or not; base reads jfk's first word with p 0.33,
    the earnings call's "Last", "And", "Our" with 0.18-0.47), not a competing word, and holding
    it held the utterance's first phrase for a whole pass."""
    doubts = []
    for word in words:
        doubts.append(unsure(word, sure) and before is not None and not ends_sentence(before.word))
        before = word
    return doubts


def read_alike(new: Sequence[Word], pending: Sequence[Word]) -> int:
    """How many of `new`'s first words the last pass read the same (by key) before it left
    them pending: the prefix two passes agree on."""
    agreed = 0
    for a, b in zip(new, pending, strict=False):
        if a.key != b.key:
            break
        agreed += 1
    return agreed


def glued(word: Word) -> bool:
    """The word continues the one before it in writing: no space, an opening mark ("-demic")."""
    return word.word != "" and word.word[0] in PREPEND_PUNCTUATION


def whole(words: Sequence[Word], count: int) -> int:
    """`count` lowered until the commit does not end inside a written word (`glued`)."""
    while 0 < count < len(words) and glued(words[count]):
        count -= 1
    return count


class CommitPolicy(Protocol):
    """How many of a pass's new words to commit; `reads_attention`: it judges by where the
    decoder looked (the passes are aligned, and a segment's committed words are forced on
    the next pass, not read again)."""

    @property
    def reads_attention(self) -> bool: ...

    def commit_count(
        self,
        new: Sequence[Word],
        pending: Sequence[Word],
        audio_end_s: float,
        before: Word | None = None,
    ) -> int:
        """new: the pass's words after the committed ones; pending: the previous pass's
        uncommitted words; audio_end_s: stream seconds where the pass's audio ends; before: the
        last committed word (None: nothing committed yet)."""
        ...


@dataclass(frozen=True)
class LocalAgreement:
    """Commit what two consecutive passes agree on (word keys, from the first new word)."""

    reads_attention: ClassVar[bool] = False

    def commit_count(
        self,
        new: Sequence[Word],
        pending: Sequence[Word],
        audio_end_s: float,
        before: Word | None = None,
    ) -> int:
        return whole(new, read_alike(new, pending))


@dataclass(frozen=True)
class AlignAtt:
    """Commit the words read while attending to audio at least `edge_s` before its end; a word
    read with probability below `sure` inside a sentence (`in_doubt`) only once the previous
    pass read the same words up to it (tiny.en reads "so, my" as "so am I", p 0.35-0.37, at
    some buffer lengths)."""

    edge_s: float = EDGE_S.default
    sure: float = SURE
    reread_below: float = REREAD_BELOW  # the word before an unsettled one waits when read
    # with a lower probability (0: never, measured; 1.01: always, the rule before)
    first_alone: bool = False  # the first reading of new speech commits alone (True: measured)
    reads_attention: ClassVar[bool] = True

    def __post_init__(self) -> None:
        EDGE_S.check("edge_s", self.edge_s)
        if not 0 <= self.sure <= 1:
            raise ValueError(f"sure must be in [0, 1], got {self.sure}")
        if self.reread_below < 0:
            raise ValueError(f"reread_below must be >= 0, got {self.reread_below}")

    def commit_count(
        self,
        new: Sequence[Word],
        pending: Sequence[Word],
        audio_end_s: float,
        before: Word | None = None,
    ) -> int:
        if not (pending or self.first_alone):  # the first reading of new speech waits
            return 0
        agreed = LocalAgreement().commit_count(new, pending, audio_end_s)
        limit = audio_end_s - self.edge_s
        doubts = in_doubt(new, before, self.sure)
        count = max(len(new) - 1, 0)
        for i, word in enumerate(new[:-1]):
            if word.peak is None or word.peak > limit or (doubts[i] and i >= agreed):
                count = i
                break
        if count > agreed and self._rereads(new[count - 1]):
            count -= 1  # the word before the unsettled one waits for a second reading
        return whole(new, count)

    def _rereads(self, word: Word) -> bool:
        """The word just before an unsettled one waits for a second reading: not read sure."""
        return word.probability is None or word.probability < self.reread_below


def make_policy(name: str, edge_s: float) -> CommitPolicy:
    if name == "alignatt":
        return AlignAtt(edge_s)
    if name == "local_agreement":
        return LocalAgreement()
    raise ValueError(f"unknown commit policy {name!r}")
