"""Enrolled voices, kept in one SQLite file in the data folder (`<data_dir>/voices.sqlite3`).

A row holds the voice's name, its speaker embedding (f32, unit length), the speaker model that
made it (`model`: a digest of the embedding graph's file), the seconds of speech it was made from
and when; the enrolment audio only when the client asked to keep it (`keep_audio`), so that a
voice can be made again when the speaker model changes. Nothing else is kept.

SQLite holds the writes together: a row is written whole or not at all, and two processes (two
replicas on one volume) can share the file (its own locks; WAL journal). What can go wrong with
the file is said as a refusal a person can act on (`Rejected`): locked by another process for
longer than the busy timeout (503, try again), the disk full (507), the file damaged or not a
database (500, naming the file). Each call opens its own connection: the store is safe from any
thread.
"""

from __future__ import annotations

import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.service.errors import Rejected

FILE_NAME = "voices.sqlite3"
BUSY_TIMEOUT_S = 5.0
MAX_NAME = 64
LOCKED_RETRY_S = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    model TEXT NOT NULL,
    embedding BLOB NOT NULL,
    speech_s REAL NOT NULL,
    created_at INTEGER NOT NULL,
    audio BLOB
)
"""


@dataclass(frozen=True, eq=False)
class Voice:
    """An enrolled voice: `model` names the speaker model its embedding was made with (equal by
    identity: it holds an array)."""

    id: str
    name: str
    model: str
    embedding: np.ndarray
    speech_s: float
    created_at: int
    has_audio: bool


class VoiceStore:
    """The registry over `path` (created with its folder on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def add(
        self,
        name: str,
        model: str,
        embedding: np.ndarray,
        speech_s: float,
        audio: bytes | None = None,
    ) -> Voice:
        """A new voice; a name taken already is a 409."""
        voice = Voice(
            id="voice_" + secrets.token_hex(8),
            name=name,
            model=model,
            embedding=np.asarray(embedding, dtype=np.float32),
            speech_s=round(float(speech_s), 2),
            created_at=int(time.time()),
            has_audio=audio is not None,
        )
        with self._connection() as db:
            try:
                db.execute(
                    "INSERT INTO voices VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (voice.id, name, model, voice.embedding.tobytes(), voice.speech_s,
                     voice.created_at, audio),
                )  # fmt: skip
            except sqlite3.IntegrityError as e:
                raise Rejected(
                    "voice_exists",
                    f"A voice named {name!r} is enrolled already: delete it first or pick "
                    "another name",
                    param="name",
                    kind="conflict",
                ) from e
        return voice

    def all(self) -> list[Voice]:
        with self._connection() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM voices ORDER BY created_at, name")
            return [_voice(row) for row in rows]

    def get(self, voice_id: str) -> Voice:
        with self._connection() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM voices WHERE id = ?", (voice_id,)).fetchone()
        if row is None:
            raise _not_found(voice_id)
        return _voice(row)

    def named(self, name: str) -> Voice | None:
        with self._connection() as db:
            row = db.execute(f"SELECT {_COLUMNS} FROM voices WHERE name = ?", (name,)).fetchone()
        return None if row is None else _voice(row)

    def audio(self, voice_id: str) -> bytes | None:
        """The enrolment audio kept with the voice (None: not kept)."""
        with self._connection() as db:
            row = db.execute("SELECT audio FROM voices WHERE id = ?", (voice_id,)).fetchone()
        if row is None:
            raise _not_found(voice_id)
        return row[0]

    def remade(self, voice_id: str, model: str, embedding: np.ndarray) -> None:
        """The voice's embedding made again by the speaker model `model`."""
        vector = np.asarray(embedding, dtype=np.float32).tobytes()
        with self._connection() as db:
            db.execute(
                "UPDATE voices SET model = ?, embedding = ? WHERE id = ?", (model, vector, voice_id)
            )

    def delete(self, voice_id: str) -> None:
        with self._connection() as db:
            if db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount == 0:
                raise _not_found(voice_id)

    @contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        """A connection in a transaction (committed on leaving, rolled back on an error); the
        file's failures as refusals."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        except (OSError, sqlite3.Error) as e:
            raise _failure(self.path, e) from e
        try:
            with db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(SCHEMA)
                yield db
        except sqlite3.Error as e:
            raise _failure(self.path, e) from e
        finally:
            db.close()


_COLUMNS = "id, name, model, embedding, speech_s, created_at, audio IS NOT NULL"


def _voice(row: tuple) -> Voice:
    voice_id, name, model, blob, speech_s, created_at, has_audio = row
    embedding = np.frombuffer(blob, dtype=np.float32).copy()
    return Voice(voice_id, name, model, embedding, speech_s, created_at, bool(has_audio))


def _not_found(voice_id: str) -> Rejected:
    return Rejected("voice_not_found", f"No voice with id {voice_id!r}", kind="not_found")


def _failure(path: Path, error: Exception) -> Rejected:
    """What the registry file's failure means to the client."""
    text = str(error).lower()
    if "locked" in text or "busy" in text:
        return Rejected(
            "voices_busy",
            f"The voice registry is locked by another process for over {BUSY_TIMEOUT_S:g} s; "
            "try again",
            kind="unavailable",
            retry_after_s=LOCKED_RETRY_S,
        )
    if "full" in text or (isinstance(error, OSError) and error.errno == 28):
        return Rejected(
            "voices_storage_full",
            "The voice registry cannot be written: the disk holding it is full",
            kind="storage",
        )
    return Rejected(
        "voices_unreadable",
        f"The voice registry file {path} cannot be used ({error}); move it away to start an "
        "empty registry, or restore it from a backup",
        kind="failed",
    )
