"""Whisper's tokenizer: byte-level BPE from `tokenizer.json` plus the model's special token ids.

The packaged `tokenizer.json` files hold no timestamp tokens: every id >= `timestamp_begin`
(the id right after `<|notimestamps|>`) is a timestamp, `<|0.00|>` + 0.02 s per id. `decode`
drops special and timestamp tokens; `decode_with_timestamps` renders timestamps as "<|1.08|>".
Special token ids come from the model's manifest and are checked against `tokenizer.json`.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Literal

import tokenizers

from app.engine.languages import LANGUAGES, to_language_code
from app.runtime.contract import TIME_PRECISION, ContractError, Manifest, SpecialTokens

Task = Literal["transcribe", "translate"]
# written without spaces between words: word timing splits them at every character
LANGUAGES_WITHOUT_SPACES = frozenset({"zh", "ja", "th", "lo", "my", "yue"})

_SPECIAL_NAMES: dict[str, tuple[str, ...]] = {
    "eot": ("<|endoftext|>",),
    "sot": ("<|startoftranscript|>",),
    "translate": ("<|translate|>",),
    "transcribe": ("<|transcribe|>",),
    "sot_lm": ("<|startoflm|>",),
    "sot_prev": ("<|startofprev|>",),
    "no_speech": ("<|nospeech|>", "<|nocaptions|>"),
    "no_timestamps": ("<|notimestamps|>",),
}


def _byte_of_char() -> dict[str, int]:
    """Byte-level BPE's alphabet (GPT-2): printable bytes stand for themselves, the others for
    the characters from U+0100 on, in byte order; this is the reverse map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(0x100 + i) for i, b in enumerate(others)})
    return {c: b for b, c in chars.items()}


_BYTE_OF_CHAR = _byte_of_char()


class Tokenizer:
    """Text <-> token ids for one Whisper model; immutable and safe to share between threads."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        special: SpecialTokens,
        *,
        multilingual: bool,
        language_ids: Mapping[str, int],
    ) -> None:
        tokenizer.encode_special_tokens = True  # "<|en|>" typed in a prompt stays plain text
        self._tok = tokenizer
        self.special = special
        self.multilingual = multilingual
        by_id = sorted(language_ids.items(), key=lambda item: item[1])
        self._language_ids: dict[str, int] = dict(by_id)
        self._language_by_id: dict[int, str] = {i: code for code, i in by_id}
        self._check()

    @classmethod
    def from_folder(cls, folder: str | Path, manifest: Manifest | None = None) -> Tokenizer:
        """Load `folder/tokenizer.json`; special ids from `manifest` (default: folder's own)."""
        folder = Path(folder)
        manifest = manifest if manifest is not None else Manifest.load(folder)
        path = folder / "tokenizer.json"
        try:
            tok = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for missing/bad files
            raise ContractError(f"cannot load {path}: {e}") from e
        return cls(
            tok,
            manifest.special,
            multilingual=manifest.multilingual,
            language_ids=manifest.language_ids,
        )

    def _check(self) -> None:
        """Raise ContractError when tokenizer.json disagrees with the special token ids."""
        problems = []
        for field, names in _SPECIAL_NAMES.items():
            token_id = getattr(self.special, field)
            found = self._tok.id_to_token(token_id)
            if found not in names:
                problems.append(f"{field}={token_id} is {found!r} (expected {names[0]})")
        if self.special.timestamp_begin != self.special.no_timestamps + 1:
            problems.append(
                f"timestamp_begin={self.special.timestamp_begin} should be no_timestamps + 1"
            )
        for code, token_id in self._language_ids.items():
            found = self._tok.id_to_token(token_id)
            if found != f"<|{code}|>":
                problems.append(f"language {code}={token_id} is {found!r}")
        if problems:
            raise ContractError(
                "tokenizer.json does not match the manifest's special tokens: "
                + "; ".join(problems[:5])
            )

    # --- special tokens -----------------------------------------------------------------

    @property
    def eot(self) -> int:
        return self.special.eot

    @property
    def sot(self) -> int:
        return self.special.sot

    @property
    def sot_prev(self) -> int:
        return self.special.sot_prev

    @property
    def sot_lm(self) -> int:
        return self.special.sot_lm

    @property
    def no_speech(self) -> int:
        return self.special.no_speech

    @property
    def no_timestamps(self) -> int:
        return self.special.no_timestamps

    @property
    def timestamp_begin(self) -> int:
        """Id of `<|0.00|>`; id `timestamp_begin + i` means i * 0.02 s into the window."""
        return self.special.timestamp_begin

    @property
    def transcribe(self) -> int:
        return self.special.transcribe

    @property
    def translate(self) -> int:
        return self.special.translate

    @property
    def language_codes(self) -> tuple[str, ...]:
        """Codes of the languages this model knows, in token-id order (empty for some .en)."""
        return tuple(self._language_ids)

    @property
    def language_tokens(self) -> tuple[int, ...]:
        """Token ids of `language_codes`, in the same order."""
        return tuple(self._language_ids.values())

    def language_token(self, language: str) -> int:
        """Token id of `<|code|>` for a code or name ("de", "German"); ValueError if unknown."""
        code = to_language_code(language)
        token_id = self._language_ids.get(code)
        if token_id is None:
            raise ValueError(
                f"language {language!r} ({LANGUAGES[code]}) is not supported by this model; "
                f"it knows {len(self._language_ids)} languages"
            )
        return token_id

    def language_code(self, token_id: int) -> str:
        """The language code of a language token id (for language detection)."""
        try:
            return self._language_by_id[token_id]
        except KeyError:
            raise ValueError(f"token {token_id} is not a language token") from None

    def sot_sequence(
        self,
        language: str | None = None,
        task: Task = "transcribe",
        *,
        without_timestamps: bool = False,
    ) -> tuple[int, ...]:
        """The forced decoder prefix.

        English-only models: `(sot,)`; they accept only language None/"en" and the transcribe
        task (ValueError otherwise). Multilingual: `(sot, <|lang|>, <|task|>)`, without the
        language token when `language` is None (detect the language first: decoding needs it).
        `without_timestamps` appends `<|notimestamps|>`.
        """
        if task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {task!r}")
        sequence = [self.sot]
        if self.multilingual:
            if language is not None:
                sequence.append(self.language_token(language))
            sequence.append(self.transcribe if task == "transcribe" else self.translate)
        else:
            if language is not None and to_language_code(language) != "en":
                raise ValueError(
                    f"this model is English-only and cannot transcribe {language!r}; "
                    "use a multilingual model"
                )
            if task == "translate":
                raise ValueError(
                    "this model is English-only and cannot translate; use a multilingual model"
                )
        if without_timestamps:
            sequence.append(self.no_timestamps)
        return tuple(sequence)

    # --- text ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added or recognised (no space prepended)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, tokens: Iterable[int]) -> str:
        """Text of the text tokens; special and timestamp tokens are dropped."""
        eot = self.eot
        return self._tok.decode([t for t in tokens if t < eot], skip_special_tokens=False)

    def decode_with_timestamps(self, tokens: Iterable[int]) -> str:
        """Text with timestamps rendered as "<|1.08|>" and other special tokens by name."""
        eot, ts_begin = self.eot, self.timestamp_begin
        parts: list[str] = []
        run: list[int] = []
        for t in tokens:
            if t < eot:
                run.append(t)
                continue
            if run:
                parts.append(self._tok.decode(run, skip_special_tokens=False))
                run = []
            if t >= ts_begin:
                parts.append(f"<|{(t - ts_begin) * TIME_PRECISION:.2f}|>")
            else:
                parts.append(self._tok.id_to_token(t) or f"<|{t}|>")
        if run:
            parts.append(self._tok.decode(run, skip_special_tokens=False))
        return "".join(parts)

    def token_bytes(self, token: int) -> bytes:
        """The UTF-8 bytes a text token stands for (a token may hold part of a character)."""
        piece = self._tok.id_to_token(token)
        if piece is None or token >= self.eot:
            raise ValueError(f"token {token} is not a text token")
        return bytes(_BYTE_OF_CHAR[c] for c in piece)

    def split_words(
        self, tokens: Sequence[int], language: str | None = None
    ) -> tuple[list[str], list[list[int]]]:
        """Words of text tokens and the tokens of each (joined, they are `tokens`).

        Languages written without spaces split at every whole character; the others at a token
        that starts with a space, is punctuation on its own, or is special (openai/whisper's
        rule). A token holding part of a multi-byte character is kept with the next one.
        """
        pieces, piece_tokens = self._split_on_characters(tokens)
        if language in LANGUAGES_WITHOUT_SPACES:
            return pieces, piece_tokens
        words: list[str] = []
        word_tokens: list[list[int]] = []
        for piece, ids in zip(pieces, piece_tokens, strict=True):
            starts_word = (
                ids[0] >= self.eot
                or piece.startswith(" ")
                or piece.strip() in string.punctuation
                or not words
            )
            if starts_word:
                words.append(piece)
                word_tokens.append(list(ids))
            else:
                words[-1] += piece
                word_tokens[-1].extend(ids)
        return words, word_tokens

    def _split_on_characters(self, tokens: Sequence[int]) -> tuple[list[str], list[list[int]]]:
        """Split tokens where a whole character ends: a piece that decodes to U+FFFD (a partial
        UTF-8 sequence) waits for the next token, unless the full text has U+FFFD there too."""
        full = self.decode_with_timestamps(tokens)
        pieces: list[str] = []
        piece_tokens: list[list[int]] = []
        current: list[int] = []
        offset = 0
        for token in tokens:
            current.append(token)
            text = self.decode_with_timestamps(current)
            bad = text.find("\ufffd")
            if bad < 0 or full[offset + bad : offset + bad + 1] == "\ufffd":
                pieces.append(text)
                piece_tokens.append(current)
                offset += len(text)
                current = []
        return pieces, piece_tokens

    def is_timestamp(self, token: int) -> bool:
        return token >= self.timestamp_begin

    def timestamp_seconds(self, token: int) -> float:
        """Seconds from the start of the window that a timestamp token stands for."""
        if token < self.timestamp_begin:
            raise ValueError(f"token {token} is not a timestamp token")
        return (token - self.timestamp_begin) * TIME_PRECISION

    def timestamp_token(self, seconds: float) -> int:
        """The timestamp token nearest to `seconds` (>= 0) from the start of the window."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        return self.timestamp_begin + round(seconds / TIME_PRECISION)

    @cached_property
    def word_continuations(self) -> tuple[int, ...]:
        """Text tokens that continue the word before them: their bytes start with an ASCII
        letter or digit or an apostrophe ("r" of " you" "r", "'re")."""
        return tuple(
            t
            for t in range(self.eot)
            if (raw := self.token_bytes(t)[:1]) == b"'" or (raw.isascii() and raw.isalnum())
        )

    @cached_property
    def non_speech_tokens(self) -> tuple[int, ...]:
        """Symbol tokens to suppress so the model does not write speaker tags or annotations
        ("♪♪♪", "( SPEAKING FOREIGN LANGUAGE )", "[DAVID] Hey there,"), keeping basic
        punctuation. Ported from openai/whisper `Tokenizer.non_speech_tokens`.
        """
        symbols = list('"#()*+/:;<=>@[\\]^_`{|}~「」『』')
        symbols += ["<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[", "('", '("', "((", "))"]
        symbols += ["(((", ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪"]
        # Between U+2640 and U+267F: when several tokens, their first token (shared first two
        # UTF-8 bytes) is safe to suppress.
        miscellaneous = set("♩♪♫♬♭♮♯")
        # allow hyphens "-" and single quotes "'" between words, not at the start of a word
        result = {self.encode(" -")[0], self.encode(" '")[0]}
        for symbol in symbols + sorted(miscellaneous):
            for tokens in (self.encode(symbol), self.encode(" " + symbol)):
                if len(tokens) == 1 or symbol in miscellaneous:
                    result.add(tokens[0])
        return tuple(sorted(result))
