"""The committed part of a live buffer: what the next pass is forced to repeat, and where the
buffer is cut.

The buffer keeps committed audio as context for what follows. Its committed closed segments
become the next pass's forced prefix (with their timestamps), so they are never decoded again;
with AlignAtt, which commits inside a segment that is still growing, the committed words of that
segment are forced too (its opening timestamp and their tokens). A pass's words are matched
against the committed ones to find the new words; once the buffer grows past `trim_s` it is cut
at the end of a committed segment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from app.engine.tokenizer import Tokenizer
from app.runtime.contract import SAMPLE_RATE, TIME_PRECISION
from app.service.live.admission import AudioBuffer
from app.service.live.options import WINDOW_S, StreamingOptions
from app.service.live.transcript import Transcript
from app.service.live.units import LiveWord, PassSegment, align_committed, split_units
from app.service.live.window_pass import Pass

log = logging.getLogger(__name__)

MAX_PREFIX_TOKENS = 160  # a longer forced prefix cuts the buffer
STALL_S = 1.5  # a pass whose text ends this long before its audio stopped early
FINAL_END_SLACK_S = 1.0  # a finalized last segment ending this close to the pause is closed there
CUT_REPEAT_S = 0.3  # a committed word decoded again this close to a buffer cut is a repeat
SENTENCE_END = (".", "!", "?")
TRAILING = ("...", "…")  # Whisper's "the speech goes on" at the end of its audio


@dataclass(frozen=True)
class Settled:
    """What `BufferContext.settle` did: cut the buffer; cut it because the decoder stalled."""

    cut: bool = False
    stalled: bool = False


class BufferContext:
    def __init__(
        self,
        buffer: AudioBuffer,
        transcript: Transcript,
        tokenizer: Tokenizer,
        options: StreamingOptions,
    ) -> None:
        self.buffer = buffer
        self.transcript = transcript
        self.tokenizer = tokenizer
        self.options = options
        self.committed: list[LiveWord] = []  # committed words still inside the buffer
        # the next pass's forced prefix: committed closed segments, then (AlignAtt) the
        # committed start of the open one (closed=False)
        self.prefix: list[PassSegment] = []

    def forget(self) -> None:
        """The buffer's committed audio is gone (or no longer context)."""
        self.committed = []
        self.prefix = []

    def prefix_tokens(self) -> tuple[tuple[int, ...], int]:
        """The forced prefix (closed committed segments, with their timestamps) and how many
        words it holds."""
        tok = self.tokenizer
        tokens: list[int] = []
        n_words = 0
        for seg in self.prefix:
            start = tok.timestamp_begin + round(seg.start / TIME_PRECISION)
            end = tok.timestamp_begin + round(seg.end / TIME_PRECISION)
            tokens += [start, *seg.tokens, end] if seg.closed else [start, *seg.tokens]
            n_words += len(split_units(tok.decode(seg.tokens)))
        return tuple(tokens), n_words

    def committed_prompt(self) -> tuple[int, ...]:
        if not self.options.condition_on_committed or self.transcript.empty:
            return ()
        return tuple(self.tokenizer.encode(self.transcript.tail(400))[-100:])

    def new_words_at(self, hyp: list[LiveWord]) -> int:
        """Where the uncommitted words of a pass begin (after the committed ones and any
        repeat of the last committed words)."""
        k = align_committed(
            [w.key for w in self.committed],
            [w.key for w in hyp],
            [(w.start + w.end) / 2 for w in hyp],
            self.transcript.end,
        )
        return self._skip_repeats(hyp, k)

    def _skip_repeats(self, hyp: list[LiveWord], k: int) -> int:
        """Move `k` past words that repeat the last committed words: a pass sometimes decodes
        the end of committed speech again. 2 to 5 words anywhere at the boundary; a single word
        only at the very start of a buffer that was just cut after it (a segment end that
        Whisper placed inside the word's sound: "billion and | and profit")."""
        recent = list(self.transcript.recent)
        for n in range(min(5, len(recent), len(hyp) - k), 1, -1):
            if [w.key for w in hyp[k : k + n]] == [w.key for w in recent[-n:]]:
                log.debug("skipped %d repeated words at the commit boundary", n)
                return k + n
        buffer_start_s = self.buffer.start / SAMPLE_RATE
        if (
            k == 0
            and hyp
            and recent
            and hyp[0].key == recent[-1].key
            and hyp[0].start - buffer_start_s < CUT_REPEAT_S
        ):
            log.debug("skipped %r repeated after the buffer cut", hyp[0].text)
            return 1
        return k

    def settle(
        self,
        decoded: Pass,
        done: int,
        *,
        forced: bool,
        final_end_s: float | None = None,
        reread_last: bool = False,
    ) -> Settled:
        """After a pass whose words hyp[:done] are committed: the closed segments holding only
        committed words become the forced prefix of the next pass; a buffer longer than `trim_s`
        is cut at the end of one of them (keeping up to half of `trim_s` as context).

        The pass's last segment may still grow and stays out, except
        - after a finalization (`final_end_s`: where the VAD found the speech over, seconds from
          the pass start), when it ends near there: then it is closed at `final_end_s`. Whisper's
          own end for it was placed with no audio after it, often inside the last word, and
          forcing that made the next pass decode the word's tail again ("for you you ask");
        - when the decoder closed it and stopped `STALL_S` or more before the audio's end: whisper
          sometimes ends a window early and then keeps doing so as the buffer grows (the speech
          after it never gets decoded). The buffer is then cut right after it, whatever its
          length, so the next pass starts on the skipped speech (`Settled.stalled`).

        With `reread_last` (a client commit, which may fall at any short pause), a finalized
        last segment that trails off (an ellipsis or no sentence end: "On Zoom, the...") stays
        out: the next pass reads its audio again with no forced text for it and goes on from
        there. Its words are committed already (matched, not sent again). Forced, Whisper's
        "..." made the next item open a new sentence ("Results for the 2020 one-eye",
        "...pound damage" for "pandemic"); a segment that ends a sentence is forced as before
        (re-reading those too cost more words than it saved: "And long cheers" for "Um, last").
        """
        hyp, segments = decoded.words, list(decoded.segments)
        reread_last = reread_last and bool(segments) and self._trails_off(segments[-1])
        audio_s = decoded.seconds
        limit = len(segments) - 1
        stalled = False
        if segments and segments[-1].closed:
            last = segments[-1]
            if final_end_s is not None and final_end_s - last.end <= FINAL_END_SLACK_S:
                if not reread_last:
                    end = max(last.end, min(final_end_s, WINDOW_S))
                    segments[-1] = PassSegment(last.start, end, last.tokens, True)
                    limit = len(segments)
            elif min(audio_s, final_end_s or audio_s) - last.end >= STALL_S:
                limit = len(segments)
                stalled = True
        covered = -1
        for i in range(limit):
            if not segments[i].closed:
                break
            last_word = max((j for j, w in enumerate(hyp) if w.segment == i), default=-1)
            if last_word >= done:
                break
            covered = i
        stalled = stalled and covered == len(segments) - 1
        self.prefix = list(segments[: covered + 1])
        part = None if reread_last else self._committed_part(decoded, done, covered + 1)
        prefix_tokens = sum(len(s.tokens) + 2 for s in self.prefix)
        too_long = audio_s > self.options.trim_s or prefix_tokens > MAX_PREFIX_TOKENS
        if covered < 0 or not (too_long or forced or stalled):
            self.prefix += [part] if part is not None else []
            return Settled()
        keep_s = self.options.trim_s / 2
        ends = [s.end for s in self.prefix]
        fitting = [i for i, e in enumerate(ends) if audio_s - e <= keep_s]
        cut_index = len(ends) - 1 if stalled or not fitting else fitting[0]
        cut_s = ends[cut_index]
        cut = decoded.start + round(cut_s * SAMPLE_RATE)
        first_kept = max((j + 1 for j, w in enumerate(hyp) if w.segment <= cut_index), default=0)
        self.buffer.drop_before(cut)
        self.committed = self.committed[first_kept:]
        kept = [*self.prefix[cut_index + 1 :], *([part] if part is not None else [])]
        self.prefix = [s.shifted(cut_s) for s in kept]
        self.transcript.close_segment()
        log.debug("buffer cut at %.2f s (segment end%s)", cut / SAMPLE_RATE,
                  ", the decoder stopped there" if stalled else "")  # fmt: skip
        return Settled(cut=True, stalled=stalled)

    def _trails_off(self, segment: PassSegment) -> bool:
        """The segment's text does not end a sentence, or ends in an ellipsis: Whisper's sign
        that the speech goes on past its audio."""
        text = self.tokenizer.decode(segment.tokens).rstrip()
        return text.endswith(TRAILING) or not text.endswith(SENTENCE_END)

    def _committed_part(self, decoded: Pass, done: int, index: int) -> PassSegment | None:
        """AlignAtt: segment `index` (still open, or not fully committed) with only the tokens
        of its committed words (hyp[:done]); None when it holds none or the policy waits for
        agreement (LocalAgreement re-decodes it)."""
        if self.options.policy != "alignatt" or index >= len(decoded.segments):
            return None
        count = sum(1 for w in decoded.words[:done] if w.segment == index)
        if count == 0:
            return None
        tokens, decode = decoded.segments[index].tokens, self.tokenizer.decode
        n = 0  # the tokens of its first `count` words, with what joins the last of them
        while n < len(tokens) and len(split_units(decode(tokens[: n + 1]))) <= count:
            n += 1
        start = decoded.segments[index].start
        return PassSegment(start, start, tokens[:n], False)


def closed_words(decoded: Pass) -> int:
    """How many of a pass's words lie in its closed segments before its last segment."""
    closed = [i for i, seg in enumerate(decoded.segments[:-1]) if seg.closed]
    if not closed:
        return 0
    return max((i + 1 for i, w in enumerate(decoded.words) if w.segment <= closed[-1]), default=0)
