"""The turn model is taken from the `pipecat-ai` wheel by sha256 (`app.export.turn`): a file
already in place is kept, a damaged one replaced, and a member whose sha256 is not the one
expected leaves nothing behind. Uses the wheel `make test-models` cached."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.engine.turn import TURN_FILE
from app.export import turn
from app.export.errors import BuildError
from app.export.sources import sha256_of
from tests.conftest import REPO

CACHE = REPO / ".cache" / "weights"


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    wheels = sorted(CACHE.glob("pipecat_ai-1.14.0-*.whl"))
    if not wheels:
        pytest.skip("the pipecat-ai wheel is not cached (make test-models fetches it)")
    target = tmp_path / "cache"
    target.mkdir()
    shutil.copy(wheels[0], target)
    return target


def test_the_model_and_its_licence_are_written_then_kept(tmp_path: Path, cache: Path) -> None:
    path, written = turn.fetch_turn(tmp_path / "models", cache)
    assert written and path == tmp_path / "models" / TURN_FILE
    assert "BSD 2-Clause" in (path.parent / "LICENSE").read_text()
    assert turn.fetch_turn(tmp_path / "models", cache) == (path, False)
    path.write_bytes(b"damaged")
    assert turn.fetch_turn(tmp_path / "models", cache)[1]
    assert sha256_of(path) == turn.MEMBERS[next(iter(turn.MEMBERS))][1]


def test_a_member_that_is_not_the_expected_file_leaves_nothing(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    member, (name, _) = next(iter(turn.MEMBERS.items()))
    monkeypatch.setattr(turn, "MEMBERS", {member: (name, "0" * 64)})
    with pytest.raises(BuildError, match="expected 0000"):
        turn.fetch_turn(tmp_path / "models", cache)
    assert list((tmp_path / "models" / "turn").iterdir()) == []
