"""What a live stream has committed, as data: a frozen `Commits` and pure functions over it.

The shape of vLLM's scheduler (`schedule()` -> run -> `update_from_output()`): `plan` says what
the next pass is forced to repeat; `step` (a pass at an open utterance) and `finalize` (a pause or
a client commit) take a pass's result and return the next state and what the session must do
(`Applied`: words to commit, where to cut the buffer, the partial). The session executes it;
nothing here touches audio, a model or a client.

The buffer keeps committed audio as context for what follows. Its committed closed segments
become the next pass's forced prefix (with their timestamps), so they are never decoded again;
with AlignAtt, which commits inside a segment that is still growing, the committed words of that
segment are forced too (its opening timestamp and their tokens). A pass's words are matched
against the committed ones to find the new words; once the buffer grows past `trim_s` it is cut
at the end of a committed segment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from app.engine.tokenizer import Tokenizer
from app.engine.words import Word, split_words
from app.runtime.contract import SAMPLE_RATE, TIME_PRECISION
from app.service.live.options import WINDOW_S, StreamingOptions
from app.service.live.policy import CommitPolicy, ends_sentence, read_alike
from app.service.live.window_pass import Pass
from app.service.live.word_match import align_committed
from app.service.transcription.windows import WindowSegment

log = logging.getLogger(__name__)

MAX_PREFIX_TOKENS = 160  # a longer forced prefix cuts the buffer
STALL_S = 1.5  # a pass whose text ends this long before its audio stopped early
FINAL_END_SLACK_S = 1.0  # a finalized last segment ending this close to the pause is closed there
CUT_REPEAT_S = 0.3  # a committed word decoded again this close to a buffer cut is a repeat
RECENT = 5  # committed words remembered across cuts (repeats at the commit boundary)


@dataclass(frozen=True)
class Commits:
    """The one home of what a stream committed, as far as decoding needs it.

    committed: committed words still inside the buffer (what the next pass repeats); pending:
    the last pass's words not committed yet; prefix: the next pass's forced prefix (committed
    closed segments, then with AlignAtt the committed start of the open one, closed=False);
    recent: the last committed words, across cuts; end_s: stream seconds where the committed
    text ends; last: the last pass, while the buffer is unchanged since; reread: the last
    finalization was a client's commit (its trailing last segment is read again, see `settle`)
    and no step pass ran since.
    """

    committed: tuple[Word, ...] = ()
    pending: tuple[Word, ...] = ()
    prefix: tuple[WindowSegment, ...] = ()
    recent: tuple[Word, ...] = ()
    end_s: float = 0.0
    last: Pass | None = None
    reread: bool = False

    def forget(self) -> Commits:
        """The buffer's committed audio is gone (or no longer context); nothing is pending."""
        return replace(self, committed=(), pending=(), prefix=(), last=None, reread=False)

    @property
    def holds_words(self) -> bool:
        """The buffer holds words (committed context or pending) worth keeping."""
        return bool(self.committed or self.pending)


@dataclass(frozen=True)
class Plan:
    """The next pass: `prefix` tokens forced (not decoded again) and `skip`, how many words of
    its text are committed already (not shown as partial)."""

    prefix: tuple[int, ...]
    skip: int


@dataclass(frozen=True)
class Applied:
    """What the session does after a pass: send `commit` as committed text; cut the buffer
    before absolute sample `cut` (and close the segment there); show `partial` (None: leave
    it). stalled: the cut is where the decoder stopped early (the rest is decoded again)."""

    commit: tuple[Word, ...] = ()
    cut: int | None = None
    partial: tuple[Word, ...] | None = None
    stalled: bool = False


def plan(state: Commits, tokenizer: Tokenizer, language: str | None) -> Plan:
    """The forced prefix of the next pass (closed committed segments with their timestamps;
    `language`: the stream's, for its word split)."""
    tokens: list[int] = []
    n_words = 0
    for seg in state.prefix:
        start = tokenizer.timestamp_begin + round(seg.start / TIME_PRECISION)
        end = tokenizer.timestamp_begin + round(seg.end / TIME_PRECISION)
        tokens += [start, *seg.tokens, end] if seg.closed else [start, *seg.tokens]
        n_words += len(split_words(tokenizer, seg.tokens, language))
    return Plan(tuple(tokens), max(len(state.committed) - n_words, 0))


def new_words_at(state: Commits, decoded: Pass) -> int:
    """Where the uncommitted words of a pass begin (after the committed ones and any repeat of
    the last committed words)."""
    hyp = decoded.words
    k = align_committed(
        [w.key for w in state.committed],
        [w.key for w in hyp],
        [(w.start + w.end) / 2 for w in hyp],
        state.end_s,
    )
    return _skip_repeats(state, decoded, k)


def _skip_repeats(state: Commits, decoded: Pass, k: int) -> int:
    """Move `k` past words that repeat the last committed words: a pass sometimes decodes the
    end of committed speech again. 2 to 5 words anywhere at the boundary; a single word only at
    the very start of a buffer that was just cut after it (a segment end that Whisper placed
    inside the word's sound: "billion and | and profit")."""
    hyp, recent = decoded.words, state.recent
    for n in range(min(RECENT, len(recent), len(hyp) - k), 1, -1):
        if [w.key for w in hyp[k : k + n]] == [w.key for w in recent[-n:]]:
            log.debug("skipped %d repeated words at the commit boundary", n)
            return k + n
    if (
        k == 0
        and hyp
        and recent
        and hyp[0].key == recent[-1].key
        and hyp[0].start - decoded.start / SAMPLE_RATE < CUT_REPEAT_S
    ):
        log.debug("skipped %r repeated after the buffer cut", hyp[0].word)
        return 1
    return k


def _before(state: Commits, decoded: Pass, k: int) -> Word | None:
    """The word before the pass's new ones (`decoded.words[k:]`): the pass's own reading of the
    committed text's last word, else the last word committed before the buffer."""
    if k:
        return decoded.words[k - 1]
    return state.recent[-1] if state.recent else None


def _with_committed(state: Commits, words: tuple[Word, ...]) -> Commits:
    """`words` are sent as committed: remembered as the recent ones, the text's end moved."""
    if not words:
        return state
    end_s = max(words[-1].end, words[0].start, state.end_s)
    return replace(state, recent=(*state.recent, *words)[-RECENT:], end_s=end_s)


def _commit_and_cut(
    state: Commits, words: tuple[Word, ...], decoded: Pass, cut: int
) -> tuple[Commits, Applied]:
    """Commit `words` and start afresh at absolute sample `cut`: no context, the audio before it
    dropped; the next pass decodes what follows."""
    cut = min(max(cut, decoded.start), decoded.end)
    return _with_committed(state, words).forget(), Applied(words, cut, ())


def step(
    state: Commits,
    decoded: Pass,
    policy: CommitPolicy,
    options: StreamingOptions,
    tokenizer: Tokenizer,
) -> tuple[Commits, Applied]:
    """A pass over the open utterance: its new words the policy says are final are committed;
    a full buffer (`max_buffer_s`) commits its closed segments whatever the policy says."""
    state = replace(state, last=None, reread=False)
    forced = decoded.seconds > options.max_buffer_s
    if not decoded.usable:
        if forced:  # a full buffer that gives no words: settle what there is, move on
            return _commit_and_cut(state, state.pending, decoded, decoded.end)
        return state, Applied(partial=state.pending)
    hyp = decoded.words
    k = new_words_at(state, decoded)
    new = hyp[k:]
    # where the pass's text ends: audio after it is not written yet, and is never cut away
    text_end = round(hyp[-1].end * SAMPLE_RATE) if hyp else decoded.end
    stalled = decoded.end - text_end >= round(STALL_S * SAMPLE_RATE)
    if stalled and read_alike(new, state.pending) == len(new):
        # the decoder ended its text long before the audio's end, and would again (Whisper
        # does that after a long forced prefix): its words are whole, the rest is new. Words
        # the last pass did not read are no such ending but a misreading that may stop early
        # (base read "did." for 4 s of speech after a pause): they wait for the policy.
        log.debug("the text stops %.1f s before the audio's end: committed, cut there",
                  (decoded.end - text_end) / SAMPLE_RATE)  # fmt: skip
        return _commit_and_cut(state, tuple(new), decoded, text_end)
    end_s = decoded.end / SAMPLE_RATE
    agreed = policy.commit_count(new, state.pending, end_s, _before(state, decoded, k))
    if forced:  # a full buffer: its closed segments are committed whatever the policy says
        agreed = max(agreed, closed_words(decoded) - k)
    commit = tuple(new[:agreed])
    state = replace(
        _with_committed(state, commit),
        committed=tuple(hyp[: k + agreed]),
        pending=tuple(new[agreed:]),
        last=decoded,
    )
    state, cut, _ = settle(state, decoded, k + agreed, options, tokenizer, forced=forced)
    if cut is not None:
        state = replace(state, last=None)
    if forced and decoded.end - (cut or decoded.start) > round(options.max_buffer_s * SAMPLE_RATE):
        # no segment boundary to cut at: commit the whole pass and start afresh after it
        log.info("buffer of %.1f s has no committed segment end: committing it",
                 decoded.seconds)  # fmt: skip
        state, applied = _commit_and_cut(state, state.pending, decoded, text_end)
        return state, replace(applied, commit=commit + applied.commit)
    return state, Applied(commit, cut, state.pending)


def finalize(
    state: Commits,
    fresh: Pass | None,
    buffer_start: int,
    until: int,
    options: StreamingOptions,
    tokenizer: Tokenizer,
    *,
    reread_last: bool,
) -> tuple[Commits, Applied]:
    """Commit every word up to absolute sample `until`: the new words of `fresh` (a pass just
    decoded up to there), or without it the last pass's pending words. The audio stays as
    context; the finalized pass's segments become the forced prefix (see `settle`).

    `reread_last`: a client's commit. A finalization right after one (the session's own pause
    in the same silence) that adds no words re-reads as it did: forcing the segment then would
    undo the re-read ("We, uh," read alone at the commit, forced, and "We are" never read)."""
    if fresh is not None:
        decoded: Pass | None = fresh
        words = tuple(fresh.words[new_words_at(state, fresh) :])
    else:
        decoded, words = state.last, state.pending
        log.debug("finalize without decoding: %d words", len(words))
    state = replace(
        _with_committed(state, words),
        committed=state.committed + words,
        pending=(),
        last=None,
    )
    if decoded is None or decoded.start != buffer_start:
        return state, Applied(words)
    reread_last = reread_last or (state.reread and not words)
    state = replace(state, committed=tuple(decoded.words), reread=reread_last)
    final_end_s = (until - decoded.start) / SAMPLE_RATE
    state, cut, stalled = settle(
        state, decoded, len(decoded.words), options, tokenizer,
        forced=False, final_end_s=final_end_s, reread_last=reread_last,
    )  # fmt: skip
    return state, Applied(words, cut, stalled=stalled)


def settle(
    state: Commits,
    decoded: Pass,
    done: int,
    options: StreamingOptions,
    tokenizer: Tokenizer,
    *,
    forced: bool,
    final_end_s: float | None = None,
    reread_last: bool = False,
) -> tuple[Commits, int | None, bool]:
    """After a pass whose words hyp[:done] are committed: (the state, where to cut the buffer
    or None, whether the cut is where the decoder stalled). The closed segments holding only
    committed words become the forced prefix of the next pass; a buffer longer than `trim_s` is
    cut at the end of one of them (keeping up to half of `trim_s` as context).

    The pass's last segment may still grow and stays out, except
    - after a finalization (`final_end_s`: where the VAD found the speech over, seconds from
      the pass start), when it ends near there: then it is closed at `final_end_s`. Whisper's
      own end for it was placed with no audio after it, often inside the last word, and
      forcing that made the next pass decode the word's tail again ("for you you ask");
    - when the decoder closed it and stopped `STALL_S` or more before the audio's end: whisper
      sometimes ends a window early and then keeps doing so as the buffer grows (the speech
      after it never gets decoded). The buffer is then cut right after it, whatever its
      length, so the next pass starts on the skipped speech.

    With `reread_last` (a client commit, which may fall at any short pause), a finalized last
    segment that trails off (an ellipsis or no sentence end: "On Zoom, the...") stays out: the
    next pass reads its audio again with no forced text for it and goes on from there. Its
    words are committed already (matched, not sent again). Forced, Whisper's "..." made the
    next item open a new sentence ("Results for the 2020 one-eye", "...pound damage" for
    "pandemic"); a segment that ends a sentence is forced as before (re-reading those too cost
    more words than it saved: "And long cheers" for "Um, last").
    """
    hyp, segments = decoded.words, list(decoded.segments)
    reread_last = reread_last and bool(segments) and _trails_off(tokenizer, segments[-1])
    audio_s = decoded.seconds
    limit = len(segments) - 1
    stalled = False
    if segments and segments[-1].closed:
        last = segments[-1]
        if final_end_s is not None and final_end_s - last.end <= FINAL_END_SLACK_S:
            if not reread_last:
                end = max(last.end, min(final_end_s, WINDOW_S))
                segments[-1] = replace(last, end=end)
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
    prefix = tuple(segments[: covered + 1])
    part = () if reread_last else _committed_part(decoded, done, covered + 1, options, tokenizer)
    prefix_tokens = sum(len(s.tokens) + 2 for s in prefix)
    too_long = audio_s > options.trim_s or prefix_tokens > MAX_PREFIX_TOKENS
    if covered < 0 or not (too_long or forced or stalled):
        return replace(state, prefix=prefix + part), None, False
    keep_s = options.trim_s / 2
    ends = [s.end for s in prefix]
    fitting = [i for i, e in enumerate(ends) if audio_s - e <= keep_s]
    cut_index = len(ends) - 1 if stalled or not fitting else fitting[0]
    cut_s = ends[cut_index]
    cut = decoded.start + round(cut_s * SAMPLE_RATE)
    first_kept = max((j + 1 for j, w in enumerate(hyp) if w.segment <= cut_index), default=0)
    kept = (*prefix[cut_index + 1 :], *part)
    log.debug("buffer cut at %.2f s (segment end%s)", cut / SAMPLE_RATE,
              ", the decoder stopped there" if stalled else "")  # fmt: skip
    state = replace(
        state,
        committed=state.committed[first_kept:],
        prefix=tuple(s.shifted(cut_s) for s in kept),
    )
    return state, cut, stalled


def _trails_off(tokenizer: Tokenizer, segment: WindowSegment) -> bool:
    """The segment's text does not end a sentence, or ends in an ellipsis: Whisper's sign that
    the speech goes on past its audio."""
    return not ends_sentence(tokenizer.decode(segment.tokens))


def _committed_part(
    decoded: Pass, done: int, index: int, options: StreamingOptions, tokenizer: Tokenizer
) -> tuple[WindowSegment, ...]:
    """AlignAtt: segment `index` (still open, or not fully committed) with only the tokens of
    its committed words (hyp[:done]); none when it holds none or the policy waits for agreement
    (LocalAgreement re-decodes it)."""
    if not options.commit_policy.reads_attention or index >= len(decoded.segments):
        return ()
    count = sum(1 for w in decoded.words[:done] if w.segment == index)
    if count == 0:
        return ()
    tokens = decoded.segments[index].tokens
    words = split_words(tokenizer, tokens, decoded.language)[:count]  # with what joins them
    n = sum(len(w.tokens) for w in words)
    start = decoded.segments[index].start
    return (WindowSegment(start, start, tokens[:n], False),)


def closed_words(decoded: Pass) -> int:
    """How many of a pass's words lie in its closed segments before its last segment."""
    closed = [i for i, seg in enumerate(decoded.segments[:-1]) if seg.closed]
    if not closed:
        return 0
    return max((i + 1 for i, w in enumerate(decoded.words) if w.segment <= closed[-1]), default=0)
