"""The inputs a scan runs on (headscope/probes/pairs.py): the corpus file, text / repeat / packed
probes, key flags."""

from __future__ import annotations

import codecs

import pytest
import torch

import headscope
from headscope.errors import HeadscopeError
from headscope.probes.pairs import (
    PunctuationTable,
    default_pairs_path,
    is_punctuation,
    load_pairs,
    packed_text_probe,
    repeat_len_for,
    repeat_probe,
    text_probe,
)

PAIRS = [("The cat sat.", "The dog slept."), ("Where is the key?", "It is on the table.")]


def write(tmp_path, data: bytes | str, name: str = "pairs.tsv"):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return p


# ------------------------------------------------------------------------------ load_pairs


def test_default_corpus():
    pairs = load_pairs()
    assert pairs == load_pairs(default_pairs_path()) and len(pairs) >= 16
    assert all(len(p) == 2 and p[0] and p[1] and "\t" not in p[0] + p[1] for p in pairs)


def test_comments_blank_lines_and_whitespace(tmp_path):
    p = write(tmp_path, "# a comment\n\n   \n  # indented comment\n a one \t b one \nA2\tB2\n\n")
    assert load_pairs(p) == [("a one", "b one"), ("A2", "B2")]


def test_windows_line_endings(tmp_path):
    assert load_pairs(write(tmp_path, "a\tb\r\nc\td\r\n")) == [("a", "b"), ("c", "d")]


@pytest.mark.parametrize(
    "body, line",
    [
        ("# c\na\tb\nno tab here\n", 3),
        ("a\tb\nx\ty\tz\n", 2),  # two TABs: three segments
        ("\na\t \n", 2),  # an empty second segment
        ("\ta\n", 1),  # an empty first segment
    ],
)
def test_a_line_that_is_not_one_pair(tmp_path, body, line):
    p = write(tmp_path, body)
    with pytest.raises(
        HeadscopeError,
        match=rf"^Prompts file '.*pairs\.tsv' line {line}: expected "
        r"two "
        r"non-empty segments separated by one TAB \(found "
        r".*\)\.$",
    ):
        load_pairs(p)


def test_spaces_instead_of_a_tab_are_named(tmp_path):
    p = write(tmp_path, "The cat sat.    The dog slept.\n")
    with pytest.raises(
        HeadscopeError, match=r"line 1 separates its segments with spaces, not a TAB"
    ):
        load_pairs(p)


def test_not_utf8_names_the_line(tmp_path):
    p = write(tmp_path, b"a\tb\n# ok\nc\xff\td\n")
    with pytest.raises(
        HeadscopeError,
        match=r"is not UTF-8 \(bad byte on line 3\); save it as "
        r"UTF-8\.$",
    ):
        load_pairs(p)
    utf16 = write(tmp_path, "a\tb\n".encode("utf-16"), "utf16.tsv")  # starts with the bytes FF FE
    with pytest.raises(HeadscopeError, match=r"bad byte on line 1"):
        load_pairs(utf16)


def test_utf8_bom_is_dropped(tmp_path):
    text = "The cat sat.\tThe dog slept.\nÀ bientôt\tSee you\n"
    plain = load_pairs(write(tmp_path, text, "plain.tsv"))
    with_bom = load_pairs(write(tmp_path, codecs.BOM_UTF8 + text.encode("utf-8"), "bom.tsv"))
    assert with_bom == plain == [("The cat sat.", "The dog slept."), ("À bientôt", "See you")]
    assert not with_bom[0][0].startswith("\ufeff")


def test_bom_before_a_comment(tmp_path):
    """With the BOM kept, the first line would read '\\ufeff# ...' and not be a comment."""
    p = write(tmp_path, codecs.BOM_UTF8 + b"# header\na\tb\n")
    assert load_pairs(p) == [("a", "b")]


def test_only_one_bom_is_dropped(tmp_path):
    p = write(tmp_path, codecs.BOM_UTF8 * 2 + b"a\tb\n")
    assert load_pairs(p)[0][0] == "\ufeffa"  # a second one is text: not ours to remove


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(
        HeadscopeError,
        match=r"^Prompts file '.*nope\.tsv' does not exist; give a "
        r"UTF-8 text file",
    ):
        load_pairs(tmp_path / "nope.tsv")
    with pytest.raises(
        HeadscopeError,
        match=r"holds no segment pairs; write one 'A<TAB>B' pair a "
        r"line\.$",
    ):
        load_pairs(write(tmp_path, "# only a comment\n\n"))
    with pytest.raises(HeadscopeError, match="holds no segment pairs"):
        load_pairs(write(tmp_path, codecs.BOM_UTF8, "bom-only.tsv"))


# ------------------------------------------------------------------------------ text probe


def test_text_probe_decoder_join(tiny_gpt2):
    m = tiny_gpt2
    probe = text_probe(m, PAIRS)
    assert probe.name == "text" and probe.repeat_len is None
    assert probe.settings == {"n_prompts": 2, "join": "decoder"}
    for (a, b), seq in zip(PAIRS, probe.sequences, strict=True):
        assert seq == [m.bos_id, *m.encode(a), m.sep_id, *m.encode(b)]  # BOS a SEP b
    assert m.eos_id is None and probe.sequences[0][-1] != m.sep_id  # nothing appended


def test_text_probe_encoder_join(tiny_bert):
    m = tiny_bert
    cls, sep = m.tokenizer.cls_token_id, m.tokenizer.sep_token_id
    probe = text_probe(m, PAIRS, n_prompts=1)
    assert probe.settings == {"n_prompts": 1, "join": "encoder"} and len(probe) == 1
    a, b = PAIRS[0]
    assert probe.sequences == [[cls, *m.encode(a), sep, *m.encode(b), sep]]  # [CLS] a [SEP] b [SEP]
    assert (m.bos_id, m.sep_id, m.eos_id) == (cls, sep, sep)


def test_text_probe_default_corpus(tiny_gpt2):
    pairs = load_pairs()
    probe = text_probe(tiny_gpt2, n_prompts=3)
    assert probe.sequences == [tiny_gpt2.join_pair(a, b) for a, b in pairs[:3]]
    assert len({len(s) for s in probe.sequences}) > 1  # varied lengths: batches get padded
    assert len(text_probe(tiny_gpt2)) == len(pairs)


def test_text_probe_bad_counts_and_long_pairs(tiny_gpt2):
    with pytest.raises(
        HeadscopeError,
        match=r"^n_prompts \(--n-prompts\) must be at least 1, got "
        r"0\.$",
    ):
        text_probe(tiny_gpt2, PAIRS, n_prompts=0)
    with pytest.raises(
        HeadscopeError,
        match=r"^n_prompts \(--n-prompts\) 3 asks for more pairs "
        r"than the corpus "
        r"holds \(2\); use at most 2\.$",
    ):
        text_probe(tiny_gpt2, PAIRS, n_prompts=3)
    long = [("ok", "fine"), ("the river bank " * 60, "b")]
    with pytest.raises(
        HeadscopeError,
        match=r"^Text pair 2 is \d+ tokens, longer than the model's "
        r"context \(128\)\.$",
    ):
        text_probe(tiny_gpt2, long)


CHAT = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}"


def test_chat_join_uses_the_template_and_is_saved(tiny_gpt2, monkeypatch):
    m = tiny_gpt2
    monkeypatch.setattr(m.tokenizer, "chat_template", CHAT)
    probe = text_probe(m, PAIRS, join="chat")
    assert probe.settings == {"n_prompts": 2, "join": "chat"} and probe.token_types is None
    for (a, b), seq in zip(PAIRS, probe.sequences, strict=True):
        expected = m.tokenizer(
            f"<|user|>{a}{m.tokenizer.eos_token}<|assistant|>{b}{m.tokenizer.eos_token}",
            add_special_tokens=False,
        )["input_ids"]
        assert seq == expected and seq != m.join_pair(a, b)


def test_chat_join_on_smollm2_has_its_turn_delimiters(smollm2):
    seq = text_probe(smollm2, PAIRS[:1], join="chat").sequences[0]
    text = smollm2.tokenizer.decode(seq)
    assert text.endswith(
        "<|im_start|>user\nThe cat sat.<|im_end|>\n<|im_start|>assistant\nThe dog "
        "slept.<|im_end|>\n"
    )
    assert text.startswith("<|im_start|>system\n")  # the template's default system turn
    assert seq.count(smollm2.sep_id) == 3  # <|im_end|> closes each of the three turns


def test_token_types_are_the_pair_segments(tiny_bert):
    m = tiny_bert
    probe = text_probe(m, PAIRS, token_types=True)
    assert probe.settings == {"n_prompts": 2, "join": "encoder", "token_types": True}
    assert probe.sequences == text_probe(m, PAIRS).sequences  # same ids, only the segments are fed
    for (a, _), seq, types in zip(PAIRS, probe.sequences, probe.token_types, strict=True):
        first = 2 + len(m.encode(a))  # [CLS] a [SEP]
        assert types == [0] * first + [1] * (len(seq) - first)
    assert text_probe(m, PAIRS).token_types is None


def test_join_and_token_type_refusals(tiny_gpt2, tiny_bert):
    with pytest.raises(
        HeadscopeError,
        match=r"^Unknown text_join \(--text-join\) 'chta'\. Did you "
        r"mean: chat\? "
        r"Use one of plain, chat\.$",
    ):
        text_probe(tiny_gpt2, PAIRS, join="chta")
    with pytest.raises(
        HeadscopeError,
        match=r"has no chat template; use the plain join "
        r"\(--text-join plain\)\.$",
    ):
        text_probe(tiny_gpt2, PAIRS, join="chat")
    with pytest.raises(
        HeadscopeError, match=r"joins turns of an instruct decoder; .* is an encoder"
    ):
        text_probe(tiny_bert, PAIRS, join="chat")
    with pytest.raises(
        HeadscopeError,
        match=r"^token_types \(--token-types\) gives encoder pairs "
        r"their segment "
        r"ids; .* is a decoder\.$",
    ):
        text_probe(tiny_gpt2, PAIRS, token_types=True)


# ------------------------------------------------------------------------------ repeat probe


def test_repeat_probe_decoder_is_bos_r_r(tiny_gpt2):
    m, L = tiny_gpt2, 7
    probe = repeat_probe(m, repeat_len=L, n_sequences=4, seed=3)
    assert probe.name == "repeat" and probe.repeat_len == L and len(probe) == 4
    assert probe.settings == {"repeat_len": L, "n_sequences": 4, "seed": 3}
    ordinary = set(m.ordinary_vocab().tolist())
    for seq in probe.sequences:
        assert len(seq) == 2 * L + 1 and seq[0] == m.bos_id
        r = seq[1 : L + 1]
        assert seq[L + 1 :] == r  # the second copy
        assert len(set(r)) == L  # distinct
        assert set(r) <= ordinary and not set(r) & m.special_ids
    assert len({tuple(s) for s in probe.sequences}) == 4  # every sequence draws its own R


def test_repeat_probe_encoder_is_cls_r_r_sep(tiny_bert):
    m, L = tiny_bert, 5
    for seq in repeat_probe(m, repeat_len=L, n_sequences=3).sequences:
        assert len(seq) == 2 * L + 2
        assert seq[0] == m.tokenizer.cls_token_id and seq[-1] == m.tokenizer.sep_token_id
        r = seq[1 : L + 1]
        assert seq[L + 1 : 2 * L + 1] == r and len(set(r)) == L and not set(r) & m.special_ids


def test_repeat_probe_is_seeded_without_the_global_rng(tiny_gpt2):
    state = torch.random.get_rng_state()
    a = repeat_probe(tiny_gpt2, repeat_len=6, n_sequences=3, seed=0).sequences
    torch.manual_seed(1234)  # the global RNG must not matter
    b = repeat_probe(tiny_gpt2, repeat_len=6, n_sequences=3, seed=0).sequences
    c = repeat_probe(tiny_gpt2, repeat_len=6, n_sequences=3, seed=1).sequences
    assert a == b and a != c
    torch.manual_seed(0)
    repeat_probe(tiny_gpt2, repeat_len=6, n_sequences=3, seed=5)
    # not consumed
    assert torch.equal(torch.random.get_rng_state(), torch.manual_seed(0).get_state())
    torch.random.set_rng_state(state)


def test_repeat_probe_first_sequences_do_not_depend_on_how_many(tiny_gpt2):
    few = repeat_probe(tiny_gpt2, repeat_len=5, n_sequences=2, seed=4).sequences
    more = repeat_probe(tiny_gpt2, repeat_len=5, n_sequences=5, seed=4).sequences
    assert more[:2] == few


@pytest.mark.parametrize("fixture, extra", [("tiny_gpt2", 1), ("tiny_bert", 2)])
def test_repeat_len_must_fit_the_context(fixture, extra, request):
    m = request.getfixturevalue(fixture)
    top = (m.n_ctx - extra) // 2
    assert len(repeat_probe(m, repeat_len=top, n_sequences=1).sequences[0]) <= m.n_ctx
    for bad in (0, top + 1):
        with pytest.raises(
            HeadscopeError,
            match=rf"^repeat_len \(--repeat-len\) {bad} does not "
            r"fit: 2 x L \+ "
            rf"{extra} tokens must fit the model's context of "
            rf"{m.n_ctx}; "
            rf"use 1\.\.{top}\.$",
        ):
            repeat_probe(m, repeat_len=bad)


def test_repeat_probe_bad_count_and_small_vocab(tiny_gpt2, monkeypatch):
    with pytest.raises(
        HeadscopeError,
        match=r"^n_prompts \(--n-prompts\) must be at least 1, got "
        r"0\.$",
    ):
        repeat_probe(tiny_gpt2, repeat_len=4, n_sequences=0)
    monkeypatch.setattr(tiny_gpt2, "ordinary_vocab", lambda: torch.arange(10, 15))
    assert set(repeat_probe(tiny_gpt2, repeat_len=5, n_sequences=1).sequences[0][1:6]) == set(
        range(10, 15)
    )
    with pytest.raises(
        HeadscopeError,
        match=r"repeat_len \(--repeat-len\) 6 exceeds the 5 "
        r"ordinary tokens; "
        r"use at most 5\.",
    ):
        repeat_probe(tiny_gpt2, repeat_len=6)


# ------------------------------------------------------------------------------ packed text,
# seq_len


def test_seq_len_probes_are_exactly_n_tokens(tiny_gpt2, tiny_bert):
    for model in (tiny_gpt2, tiny_bert):
        text = packed_text_probe(model, None, seq_len=97, n_sequences=3)
        assert [len(s) for s in text.sequences] == [97, 97, 97]
        assert text.sequences[0] != text.sequences[1]  # continues through the corpus
        assert text.sequences[0][0] == model.bos_id
        L = repeat_len_for(model, 97)
        rep = headscope.repeat_probe(model, repeat_len=L, n_sequences=1)
        assert 96 <= len(rep.sequences[0]) <= 97
        with pytest.raises(headscope.HeadscopeError, match="--seq-len"):
            packed_text_probe(model, None, seq_len=model.n_ctx + 1)


def expected_stream(model, pairs, n_tokens: int, start: int = 0) -> tuple[list[int], int]:
    """Segments from index ``start`` (cycling) joined by SEP until ``n_tokens``; and the next
    index."""
    segs = [model.encode(s) for p in pairs for s in p]
    out, i = [], start
    while len(out) < n_tokens:
        out += ([model.sep_id] if out else []) + segs[i % len(segs)]
        i += 1
    return out[:n_tokens], i


def test_packed_decoder_layout(tiny_gpt2):
    m = tiny_gpt2
    probe = packed_text_probe(m, PAIRS * 4, seq_len=30, n_sequences=2)
    assert probe.name == "text" and probe.settings == {
        "n_prompts": 2,
        "seq_len": 30,
        "packed": True,
        "join": "decoder",
    }
    body, nxt = expected_stream(m, PAIRS * 4, 29)
    assert probe.sequences[0] == [m.bos_id, *body]  # BOS a1 SEP b1 SEP a2 ...
    # the next sequence starts at the next segment
    body2, _ = expected_stream(m, PAIRS * 4, 29, start=nxt)
    assert probe.sequences[1] == [m.bos_id, *body2]


def test_packed_encoder_layout(tiny_bert):
    m = tiny_bert
    probe = packed_text_probe(m, PAIRS, seq_len=20, n_sequences=1)
    body, _ = expected_stream(m, PAIRS, 18)
    assert probe.sequences == [[m.bos_id, *body, m.eos_id]]  # [CLS] a1 [SEP] b1 [SEP] ... [SEP]
    assert probe.settings["join"] == "encoder"


def test_packed_wraps_a_short_corpus_only_when_asked(tiny_gpt2):
    m = tiny_gpt2
    short = [("cat", "dog")]
    with pytest.raises(HeadscopeError, match="enough text for 0 sequence"):  # never silently
        packed_text_probe(m, short, seq_len=40)
    probe = packed_text_probe(m, short, seq_len=40, wrap=True)
    body, used = expected_stream(m, short, 39)
    # the two segments came round more than once
    assert probe.sequences[0] == [m.bos_id, *body] and used > 2
    assert probe.settings["wrapped"] is True


def test_packed_refuses_a_corpus_with_no_tokens(tiny_gpt2, tiny_bert):
    with pytest.raises(HeadscopeError, match="no text that tokenizes"):
        packed_text_probe(tiny_gpt2, [], seq_len=10)
    # a zero-width space is no token: packing it would never end
    assert tiny_bert.encode("\u200b") == []
    with pytest.raises(HeadscopeError, match="no text that tokenizes"):
        packed_text_probe(tiny_bert, [("\u200b", "\u200b")], seq_len=10)


@pytest.mark.parametrize("fixture, low", [("tiny_gpt2", 3), ("tiny_bert", 4)])
def test_seq_len_bounds(fixture, low, request):
    m = request.getfixturevalue(fixture)
    assert len(packed_text_probe(m, PAIRS, seq_len=low, wrap=True).sequences[0]) == low
    assert len(packed_text_probe(m, PAIRS, seq_len=m.n_ctx, wrap=True).sequences[0]) == m.n_ctx
    for bad in (low - 1, m.n_ctx + 1):
        msg = (
            rf"^seq_len \(--seq-len\) {bad} is outside {low}\.\.{m.n_ctx} "
            rf"\(the model's context\); use at most {m.n_ctx}\.$"
        )
        with pytest.raises(HeadscopeError, match=msg):
            packed_text_probe(m, PAIRS, seq_len=bad)
        with pytest.raises(HeadscopeError, match=msg):
            repeat_len_for(m, bad)
    with pytest.raises(
        HeadscopeError, match=r"n_prompts \(--n-prompts\) must be at least 1, got 0"
    ):
        packed_text_probe(m, PAIRS, seq_len=10, n_sequences=0)


def test_repeat_len_for(tiny_gpt2, tiny_bert):
    assert repeat_len_for(tiny_gpt2, 97) == 48  # BOS + 48 + 48 = 97
    assert repeat_len_for(tiny_gpt2, 96) == 47  # 95 tokens: the longest that fits
    assert repeat_len_for(tiny_bert, 97) == 47  # [CLS] + 47 + 47 + [SEP] = 96
    assert repeat_len_for(tiny_bert, 98) == 48
    assert repeat_len_for(tiny_gpt2, 3) == repeat_len_for(tiny_bert, 4) == 1


# ------------------------------------------------------------------------------ punctuation


@pytest.mark.parametrize(
    "text, expected",
    [
        (".", True),
        (" .", True),
        ("...", True),
        ("!?", True),
        (" ,\n", True),
        ("'", True),
        ('"', True),
        ("—", True),
        ("«»", True),
        ("。", True),
        ("()", True),
        ("-", True),
        ("a.", False),
        ("", False),
        (" ", False),
        ("\n", False),
        ("1", False),
        ("$", False),
        ("+", False),
        ("=", False),
        ("^", False),
        ("𝐚", False),
        ("[SEP]", False),
    ],
)
def test_is_punctuation(text, expected):
    assert is_punctuation(text) is expected


class FakeModel:
    def __init__(self, vocab: dict[int, str]):
        self.vocab = vocab
        self.decoded: list[int] = []

    def decode_one(self, token_id: int) -> str:
        self.decoded.append(token_id)
        return self.vocab[token_id]


def test_punctuation_table_flags_and_caches():
    model = FakeModel({0: "<s>", 1: " cat", 2: ".", 3: " ,", 4: "dog"})
    table = PunctuationTable(model)
    ids = torch.tensor([[0, 1, 2, 1], [3, 4, 2, 2]])
    flags = table(ids)
    assert flags.dtype == torch.bool
    assert flags.tolist() == [[False, False, True, False], [True, False, True, True]]
    assert sorted(model.decoded) == [0, 1, 2, 3, 4]  # each id decoded once
    assert table(torch.tensor([[2, 4, 0]])).tolist() == [[True, False, False]]
    assert sorted(model.decoded) == [0, 1, 2, 3, 4]  # all known: nothing decoded again


def test_punctuation_table_on_a_real_tokenizer(tiny_gpt2, tiny_bert):
    for m in (tiny_gpt2, tiny_bert):
        ids = m.encode("the cat. where?")
        flags = PunctuationTable(m)(torch.tensor([ids]))[0].tolist()
        assert flags == [is_punctuation(m.decode_one(i)) for i in ids]
        assert [m.decode_one(i).strip() for i, f in zip(ids, flags, strict=True) if f] == [".", "?"]


# ------------------------------------------------------------------------------ the positional null


def _hand_built_patterns(seqs, rule):
    """A [batch, 1, n, n] pattern from a rule (tokens, q) -> the key the head attends to."""
    n = len(seqs[0])
    A = torch.zeros(len(seqs), 1, n, n)
    for b, ids in enumerate(seqs):
        for q in range(n):
            A[b, 0, q, rule(ids, q)] = 1.0
    return A


def _fixed_offset(L):
    return lambda ids, q: q - L + 1 if q - L + 1 >= 0 else 0


def _induction(ids, q):
    """Attend to the token after the earlier copy of the current token; BOS when there is none."""
    earlier = [j for j in range(q) if ids[j] == ids[q]]
    return earlier[-1] + 1 if earlier else 0


def test_the_null_tells_a_fixed_offset_head_from_an_induction_head(tiny_gpt2):
    from headscope.probes.pairs import null_probe
    from headscope.scanner.scoring import score_pattern

    L = 6
    repeat = repeat_probe(tiny_gpt2, repeat_len=L, n_sequences=3, seed=4)
    null = null_probe(repeat, tiny_gpt2)
    assert [len(s) for s in null.sequences] == [len(s) for s in repeat.sequences]
    assert all(len(set(s[1:])) == 2 * L for s in null.sequences)  # no repetition at all
    assert null.settings["null_of"] == "repeat" and null.repeat_len == L
    scores = {}
    for name, rule in (("fixed offset", _fixed_offset(L)), ("induction", _induction)):
        for probe in (repeat, null):
            A = _hand_built_patterns(probe.sequences, rule)
            scores[name, probe.name] = float(
                score_pattern(A, "induction", causal=True, repeat_len=L, pooled=True)
            )
    # the same on the probe
    assert scores["fixed offset", "repeat"] == scores["induction", "repeat"] == 1.0
    assert scores["fixed offset", "repeat_null"] == 1.0  # the null gives the fixed-offset head away
    assert scores["induction", "repeat_null"] == 0.0
