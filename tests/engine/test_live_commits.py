"""Live commits as data (`app.service.live.commits`): a pass's result applied to the frozen
commit state, on word lists. Only the tokenizer is real (segments hold token ids); no model, no
audio, no session."""

from __future__ import annotations

from dataclasses import replace

from app.engine.decoding_types import DecodingResult
from app.engine.tokenizer import Tokenizer
from app.engine.words import Word
from app.runtime.contract import SAMPLE_RATE
from app.service.live import commits
from app.service.live.commits import Commits
from app.service.live.events import PartialText
from app.service.live.options import StreamingOptions
from app.service.live.policy import AlignAtt, LocalAgreement
from app.service.live.transcript import Transcript
from app.service.live.window_pass import Pass, spread_words
from app.service.transcription.windows import WindowSegment

ALIGNATT = StreamingOptions(language="en", vad=None)
AGREEMENT = StreamingOptions(language="en", vad=None, policy="local_agreement")


def make_pass(
    tok: Tokenizer,
    segments: list[tuple[float, float, str, bool]],
    seconds: float,
    start_s: float = 0.0,
    unsure: str = "",
) -> Pass:
    """A pass over `seconds` of audio from stream second `start_s`: segments (start, end, text,
    closed) in seconds from the pass start; each word's attention peak is its end, its
    probability 0.95 (0.3 for the words in `unsure`)."""
    segs = [WindowSegment(a, b, tuple(tok.encode(text)), closed) for a, b, text, closed in segments]
    words = [
        replace(w, peak=w.end, probability=0.3 if w.key in unsure.split() else 0.95)
        for w in spread_words(tok, segs, start_s, "en")
    ]
    tokens = tuple(t for s in segs for t in s.tokens)
    result = DecodingResult(tokens, tok.decode(tokens), -0.1, -0.5, 0.0, 0.0, 1.0, "en")
    start = round(start_s * SAMPLE_RATE)
    return Pass(words, segs, start, start + round(seconds * SAMPLE_RATE), result, "en")


def texts(words) -> str:
    return "".join(w.word for w in words).strip()


def read_once(tok: Tokenizer, text: str, state: Commits | None = None) -> Commits:
    """`state` (default: nothing) after a pass that read `text` and committed none of it: the
    first reading of new speech never commits alone (`AlignAtt`), the next pass may."""
    words = make_pass(tok, [(0.0, 1.0, text, False)], 1.0).words
    return replace(state or Commits(), pending=tuple(words))


def test_alignatt_commits_before_the_edge_and_forces_what_it_committed(tiny_tok: Tokenizer) -> None:
    decoded = make_pass(tiny_tok, [(0.0, 4.0, " and so my fellow americans", False)], 4.0)
    earlier = read_once(tiny_tok, " and so")
    state, applied = commits.step(earlier, decoded, AlignAtt(0.7), ALIGNATT, tiny_tok)
    # the words spread over 4 s by characters, peaks at their ends: the last word waits (the
    # one before it, read sure, does not)
    assert texts(applied.commit) == "and so my fellow"
    assert texts(state.committed) == "and so my fellow" and texts(state.pending) == "americans"
    assert applied.partial == state.pending and applied.cut is None
    assert state.last is decoded and state.end_s == decoded.words[3].end
    # the next pass repeats the committed words as a forced prefix: the open segment's opening
    # timestamp and their tokens, no closing timestamp; none of them shown as partial again
    plan = commits.plan(state, tiny_tok, "en")
    assert plan.prefix == (tiny_tok.timestamp_begin, *tiny_tok.encode(" and so my fellow"))
    assert plan.skip == 0

    # the next pass reads on after them: only its new words count; it read "americans" again
    later = make_pass(tiny_tok, [(0.0, 5.0, " and so my fellow americans ask not", False)], 5.0)
    assert commits.new_words_at(state, later) == 4
    state, applied = commits.step(state, later, AlignAtt(0.7), ALIGNATT, tiny_tok)
    assert texts(applied.commit) == "americans"  # 'ask' ends 0.16 s into the edge
    assert texts(state.committed) == "and so my fellow americans"


def test_the_partial_leaves_out_the_words_a_pass_repeats_from_the_committed_text(
    tiny_tok: Tokenizer,
) -> None:
    """LocalAgreement decodes committed words again (`Plan.skip` of them): they are counted
    with the pass's own word split ("so," is one word) and never shown as partial."""
    events: list[object] = []
    feed = Transcript(events.append).token_feed(tiny_tok, 2, "en")
    for token in tiny_tok.encode(" And so, my fellow Americans"):
        feed(token)
    partials = [e.text for e in events if isinstance(e, PartialText)]
    assert partials == [" my", " my fellow", " my fellow Americans"]


def test_a_word_the_split_cut_at_a_hyphen_reads_whole_when_committed_in_two_parts() -> None:
    """The one word split cuts "fat-mutton" into " fat" and "-mutton" (openai/whisper's rule):
    committed apart, the parts still read as one word; a word that lost its space gets one."""
    transcript = Transcript(lambda _e: None)
    transcript.commit([Word(0.0, 0.2, " fat", 0.9)], "en")
    transcript.commit([Word(0.2, 0.5, "-mutton", 0.9), Word(0.5, 0.8, " pieces", 0.9)], "en")
    transcript.commit([Word(0.8, 1.0, "to", 0.9)], "en")
    assert transcript.text == "fat-mutton pieces to"


def test_local_agreement_commits_what_two_passes_read(tiny_tok: Tokenizer) -> None:
    first = make_pass(tiny_tok, [(0.0, 3.0, " and so my fellow", False)], 3.0)
    state, applied = commits.step(Commits(), first, LocalAgreement(), AGREEMENT, tiny_tok)
    assert applied.commit == () and texts(state.pending) == "and so my fellow"
    second = make_pass(tiny_tok, [(0.0, 4.0, " and so my fellow americans", False)], 4.0)
    state, applied = commits.step(state, second, LocalAgreement(), AGREEMENT, tiny_tok)
    assert texts(applied.commit) == "and so my fellow" and texts(state.pending) == "americans"
    assert commits.plan(state, tiny_tok, "en").prefix == ()  # nothing forced: it decodes it again


def test_an_unsure_word_waits_for_the_next_pass(tiny_tok: Tokenizer) -> None:
    """The flaky jfk commit: one pass reads 'so am I' with low probability; it is not
    committed until the next pass reads the same."""
    misread = make_pass(tiny_tok, [(0.0, 4.0, " and so am i fellow americans", False)], 4.0,
                        unsure="am")  # fmt: skip
    earlier = read_once(tiny_tok, " and")
    state, applied = commits.step(earlier, misread, AlignAtt(0.7), ALIGNATT, tiny_tok)
    assert texts(applied.commit) == "and so" and texts(state.pending).startswith("am i")
    read = make_pass(tiny_tok, [(0.0, 6.0, " and so my fellow americans ask", False)], 6.0)
    state, applied = commits.step(state, read, AlignAtt(0.7), ALIGNATT, tiny_tok)
    assert texts(applied.commit) == "my fellow americans"


def test_text_that_stops_long_before_the_audio_is_committed_and_cut_there(
    tiny_tok: Tokenizer,
) -> None:
    """After a long forced prefix Whisper may end its text seconds before the audio, pass after
    pass (AlignAtt would wait for a word after the last one forever): its words are committed
    and the buffer cut after them, so the next pass decodes the speech after. Words the pass
    before did not read are not such an ending: base once read 4 s of speech after a pause as
    "did.", and the cut after it dropped "Excellency said Pestrini"."""
    stalled = make_pass(tiny_tok, [(0.0, 5.0, " we are on zoom", False)], 8.0)
    for policy, options in ((AlignAtt(0.7), ALIGNATT), (LocalAgreement(), AGREEMENT)):
        once = read_once(tiny_tok, " we did")
        state, applied = commits.step(once, stalled, policy, options, tiny_tok)
        assert applied.cut is None and texts(state.pending).endswith("zoom")  # waits
        state, applied = commits.step(state, stalled, policy, options, tiny_tok)
        assert texts(applied.commit).endswith("zoom")  # read again: the rest, whatever policy
        assert applied.cut == round(stalled.words[-1].end * SAMPLE_RATE) and applied.partial == ()
        assert state.committed == state.pending == state.prefix == ()
        assert texts(state.recent) == "we are on zoom"
    # the same when every word is committed already: nothing new, the cut is still made
    done = replace(Commits(), committed=tuple(stalled.words), end_s=stalled.words[-1].end)
    state, applied = commits.step(done, stalled, LocalAgreement(), AGREEMENT, tiny_tok)
    assert applied.commit == () and applied.cut is not None and state.committed == ()


def test_a_closed_segment_the_decoder_stopped_after_cuts_the_buffer(tiny_tok: Tokenizer) -> None:
    """Whisper sometimes closes a segment seconds before the audio ends and keeps doing so as
    the buffer grows: once its words are committed, the buffer is cut after it."""
    stalled = make_pass(tiny_tok, [(0.0, 5.0, " we are on zoom", True)], 8.0)
    state = replace(Commits(), committed=tuple(stalled.words))
    state, cut, was_stalled = commits.settle(
        state, stalled, len(stalled.words), ALIGNATT, tiny_tok, forced=False
    )
    assert was_stalled and cut == 5 * SAMPLE_RATE and state.committed == ()
    # a last segment that ends with the audio may still grow: no cut, not forced whole
    growing = make_pass(tiny_tok, [(0.0, 7.5, " we are on zoom", True)], 8.0)
    for options, forced in ((AGREEMENT, ()), (ALIGNATT, ((growing.segments[0].tokens, False),))):
        state = replace(Commits(), committed=tuple(growing.words))
        state, cut, was_stalled = commits.settle(
            state, growing, len(growing.words), options, tiny_tok, forced=False
        )
        assert cut is None and not was_stalled
        assert [(s.tokens, s.closed) for s in state.prefix] == list(forced)


def test_a_long_buffer_is_cut_at_a_committed_segment_end(tiny_tok: Tokenizer) -> None:
    decoded = make_pass(
        tiny_tok,
        [(0.0, 4.0, " one two three.", True), (4.0, 9.0, " four five six.", True),
         (9.0, 12.0, " seven eight", False)],
        12.0, start_s=3.0, unsure="seven",
    )  # fmt: skip
    earlier = read_once(tiny_tok, " one two")
    state, applied = commits.step(earlier, decoded, AlignAtt(0.7), ALIGNATT, tiny_tok)
    assert texts(applied.commit) == "one two three. four five six."  # "seven": read unsure
    # longer than trim_s (10 s): cut at the first segment end that keeps <= 5 s of context
    assert applied.cut == round((3.0 + 9.0) * SAMPLE_RATE)
    assert state.committed == () and state.prefix == ()  # the words before the cut are gone
    assert texts(state.pending) == "seven eight" and state.last is None


def test_finalize_commits_the_pending_words_and_closes_the_segment_at_the_pause(
    tiny_tok: Tokenizer,
) -> None:
    decoded = make_pass(tiny_tok, [(0.0, 2.4, " ask not what your country", True)], 3.0,
                        unsure="your")  # fmt: skip
    earlier = read_once(tiny_tok, " ask")
    state, applied = commits.step(earlier, decoded, AlignAtt(0.7), ALIGNATT, tiny_tok)
    assert texts(applied.commit) == "ask not what"
    until = round(2.8 * SAMPLE_RATE)
    # no fresh pass: the last pass's pending words
    final, applied = commits.finalize(
        state, None, decoded.start, until, ALIGNATT, tiny_tok, reread_last=False
    )
    assert texts(applied.commit) == "your country" and applied.cut is None
    assert final.pending == () and final.last is None
    assert [(s.end, s.closed) for s in final.prefix] == [(2.8, True)]  # closed at the pause
    # a client's commit on text that trails off: its audio is read again, nothing forced
    final, applied = commits.finalize(
        state, None, decoded.start, until, ALIGNATT, tiny_tok, reread_last=True
    )
    assert texts(applied.commit) == "your country" and final.prefix == ()
    # a fresh pass up to the pause: its words after the committed ones
    fresh = make_pass(tiny_tok, [(0.0, 2.6, " ask not what your country can", True)], 2.8)
    final, applied = commits.finalize(
        state, fresh, fresh.start, until, ALIGNATT, tiny_tok, reread_last=False
    )
    assert texts(applied.commit) == "your country can"
    assert texts(final.committed) == "ask not what your country can"


def test_a_step_spares_an_unsure_word_that_opens_a_sentence(tiny_tok: Tokenizer) -> None:
    """The gate holds an unsure word inside a sentence only: `step` hands the policy the word
    before the pass's new ones, the pass's own reading of the committed text's end or, with
    nothing committed in the buffer, the last word committed before it."""
    for text, opens in ((" ask not. what your country can", True),
                        (" ask not what your country can", False)):  # fmt: skip
        decoded = make_pass(tiny_tok, [(0.0, 5.0, text, False)], 5.0, unsure="what")
        state = read_once(tiny_tok, " so", replace(Commits(), committed=tuple(decoded.words[:2])))
        assert commits.new_words_at(state, decoded) == 2
        _, applied = commits.step(state, decoded, AlignAtt(0.7), ALIGNATT, tiny_tok)
        assert texts(applied.commit).startswith("what") == opens, text
        cut = make_pass(tiny_tok, [(0.0, 3.0, " what your country can", False)], 3.0,
                        unsure="what")  # fmt: skip
        state = read_once(tiny_tok, " so", replace(Commits(), recent=tuple(decoded.words[:2])))
        _, applied = commits.step(state, cut, AlignAtt(0.7), ALIGNATT, tiny_tok)
        assert texts(applied.commit).startswith("what") == opens, text


def test_a_pause_right_after_a_client_commit_reads_its_trailing_segment_again(
    tiny_tok: Tokenizer,
) -> None:
    """The client commits inside "We are" ("We, uh,": trails off, left to be read again); the
    session's own pause in the same silence finalizes that reading again, adding no words: it
    is not forced either, so the next pass can still read "are". A pause that follows a pass of
    the open utterance closes and forces the segment as before."""
    reading = make_pass(tiny_tok, [(0.0, 0.84, " We, uh,", True)], 0.9)
    until = round(0.9 * SAMPLE_RATE)
    state, applied = commits.finalize(
        Commits(), reading, 0, until, ALIGNATT, tiny_tok, reread_last=True
    )
    assert texts(applied.commit) == "We, uh," and state.prefix == ()
    again = make_pass(tiny_tok, [(0.0, 0.84, " We, uh,", True)], 0.97)
    paused, applied = commits.finalize(
        state, again, 0, round(0.97 * SAMPLE_RATE), ALIGNATT, tiny_tok, reread_last=False
    )
    assert applied.commit == () and paused.prefix == ()
    stepped, _ = commits.step(state, again, AlignAtt(0.7), ALIGNATT, tiny_tok)
    paused, _ = commits.finalize(
        stepped, again, 0, round(0.97 * SAMPLE_RATE), ALIGNATT, tiny_tok, reread_last=False
    )
    assert [(s.end, s.closed) for s in paused.prefix] == [(0.97, True)]
