"""The README stays true: its first lines give the two commands, its table lists every setting."""

from __future__ import annotations

import re

from app.config import Settings
from tests.conftest import REPO

README = (REPO / "README.md").read_text()


def test_first_lines_give_run_and_test() -> None:
    head = README.splitlines()[:5]
    assert any(line.strip().startswith("make run") for line in head)
    assert any(line.strip().startswith("make test") for line in head)


def test_settings_table_lists_every_setting() -> None:
    documented = set(re.findall(r"^\| `(STT_[A-Z_]+)` \|", README, flags=re.MULTILINE))
    expected = {f"STT_{name.upper()}" for name in Settings.model_fields}
    assert documented == expected


def test_makefile_has_the_readme_targets() -> None:
    makefile = (REPO / "Makefile").read_text()
    for target in ("run", "test", "models", "test-docker"):
        assert re.search(rf"^{re.escape(target)}:", makefile, flags=re.MULTILINE), target
