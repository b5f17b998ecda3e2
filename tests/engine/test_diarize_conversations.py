"""Uploads diarized whole, on devcorpus conversations of readers the clustering was not tuned on
(`benchmarks/live_speakers.py`'s seeded conversations, 0.6-1.2 s between utterances).

In these two, a segmentation window heard two readers across a pause as one local speaker: its
embedding (mostly one reader's) put both readers' speech in one cluster, so an utterance of the
reader left unenrolled carried an enrolled reader's name. Each run of one speaker talking alone
is checked against the clusters by its own embedding and goes where it is clearly nearer."""

from __future__ import annotations

import pytest

from app.runtime.placement import RuntimeOptions
from app.service.diarize.job import LazyDiarizer
from benchmarks.live_speakers import (
    conversation,
    labels_used,
    mapped_share,
    named,
    readers,
    upload_labels,
)
from tests.conftest import MODELS_DIR

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def diarizer() -> LazyDiarizer:
    return LazyDiarizer(MODELS_DIR, RuntimeOptions(ep="cpu"))


@pytest.mark.parametrize(("count", "seed"), [(2, 4), (3, 5)])
def test_each_utterance_goes_to_its_reader_and_no_stranger_is_named(
    diarizer: LazyDiarizer, count: int, seed: int
) -> None:
    talk = conversation(readers(), count, seed)
    people = list(dict.fromkeys(reader for _, _, reader in talk.spans))
    model = diarizer.get()
    known = [(p, model.reference(talk.enrol[p])) for p in people[:-1]]  # all but the last
    plain, with_known = upload_labels(diarizer, talk, [[], known])
    for said in (plain, with_known):
        assert labels_used(said) == count
        assert mapped_share(talk, said) == 1.0  # each utterance's main label is its reader's
    enrolled_right, stranger_named = named(talk, with_known, people)
    assert enrolled_right == 1.0
    assert not stranger_named
