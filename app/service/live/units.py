"""Words and segments of one live pass, and where a pass's new words begin.

A pass decodes the whole buffer (committed words included), so its words must be matched against
the committed ones: `align_committed` finds where the new words start even when the pass spells
or splits the committed words differently.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.runtime.contract import TIME_PRECISION

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_UNIT = re.compile(rf"\s*[{_CJK}]|\s*[^\s{_CJK}]+|\s+$")


@dataclass(frozen=True)
class LiveWord:
    """A word of one pass.

    text: as decoded, with its leading space; key: normalised for comparison; start/end: stream
    seconds; segment: index of its segment in the pass; peak: stream seconds where the alignment
    heads looked last while its tokens were read (None without attention), for AlignAtt;
    probability: the decoder's, the mean of its tokens' (None without alignment).
    """

    text: str
    key: str
    start: float
    end: float
    segment: int
    peak: float | None = None
    probability: float | None = None


def word_key(text: str) -> str:
    kept = "".join(c for c in text.lower() if c.isalnum())
    return kept or text.strip().lower()


def split_units(text: str) -> list[str]:
    """Words with their leading whitespace (CJK characters are units of their own);
    `"".join(split_units(t)) == t` up to trailing whitespace."""
    return [u for u in _UNIT.findall(text) if u.strip()]


def is_cjk(char: str) -> bool:
    return bool(char) and re.match(f"[{_CJK}]", char) is not None


@dataclass(frozen=True)
class PassSegment:
    start: float  # seconds from the buffer start
    end: float
    tokens: tuple[int, ...]
    closed: bool  # ended by a timestamp token

    def shifted(self, seconds: float) -> PassSegment:
        return PassSegment(self.start - seconds, self.end - seconds, self.tokens, self.closed)


def split_segments(
    tokens: Sequence[int], timestamp_begin: int, duration: float
) -> list[PassSegment]:
    """Cut one window's tokens into segments at timestamp tokens; keep the unfinished tail.

    `<|a|> text <|b|><|b|> text <|c|>` -> [a, b) and [b, c); text after the last timestamp is an
    open segment ending at `duration`.
    """
    segments: list[PassSegment] = []
    start: float | None = None
    text: list[int] = []
    for t in tokens:
        if t >= timestamp_begin:
            ts = min((t - timestamp_begin) * TIME_PRECISION, duration)
            if text:
                begin = start if start is not None else 0.0
                segments.append(PassSegment(begin, max(ts, begin), tuple(text), True))
                text = []
            start = ts
        else:
            text.append(t)
    if text:
        begin = start if start is not None else 0.0
        segments.append(PassSegment(begin, max(duration, begin), tuple(text), False))
    return segments


def align_committed(
    committed: Sequence[str],
    hyp: Sequence[str],
    hyp_mid_s: Sequence[float] | None = None,
    committed_end_s: float | None = None,
) -> int:
    """Index in `hyp` where the words after `committed` begin (both are word keys).

    The pass usually repeats the committed words; when it spells or splits them differently,
    the last committed words are looked up near where they are expected, then matched with
    difflib. Committed words the pass does not have are not skipped blindly: a hyp word after
    the last match counts as committed when it is spelled like the committed word there
    ("apologize"/"apologise") or its middle (`hyp_mid_s`, stream seconds) lies before the end
    of the committed text (`committed_end_s`); without times, by position.
    """
    n = len(committed)
    if n == 0:
        return 0
    if list(hyp[:n]) == list(committed):
        return n
    # the last few committed words, found near where they are expected
    for m in (3, 2):
        if n < m:
            continue
        tail = list(committed[-m:])
        candidates = [
            k
            for k in range(max(m, n - 3), min(len(hyp), n + 3) + 1)
            if list(hyp[k - m : k]) == tail
        ]
        if candidates:
            return min(candidates, key=lambda k: abs(k - n))
    matcher = difflib.SequenceMatcher(None, list(committed), list(hyp[: n + 5]), autojunk=False)
    blocks = [b for b in matcher.get_matching_blocks() if b.size]
    k, unmatched = (
        (blocks[-1].b + blocks[-1].size, n - blocks[-1].a - blocks[-1].size) if blocks else (0, n)
    )
    for i in range(n - unmatched, n):
        if k >= len(hyp):
            break
        respelled = difflib.SequenceMatcher(None, committed[i], hyp[k]).ratio() >= 0.75
        timed = hyp_mid_s is not None and committed_end_s is not None
        if not respelled and timed and hyp_mid_s[k] > committed_end_s:  # type: ignore[index]
            break  # a different word, later than the committed text: a new one
        k += 1
    return k
