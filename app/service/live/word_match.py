"""Where a live pass's new words begin.

A pass decodes the whole buffer (committed words included), so its words must be matched against
the committed ones: `align_committed` finds where the new words start even when the pass spells
or splits the committed words differently.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"


def is_cjk(char: str) -> bool:
    return bool(char) and re.match(f"[{_CJK}]", char) is not None


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
