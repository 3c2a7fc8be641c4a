"""omrl.store.search: the indexed search returns exactly what a brute-force scan returns (random words from the
corpus, absent words, phrases, unicode, tokens longer than the index keeps, words that exist only across
two messages) without reading message text, parts without an index are scanned, the index files stay out
of the store's data, and `omrl query --search` works on the one confined connection."""

from __future__ import annotations

import json
import os
import random
import re
import warnings
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from conftest import make_trajectory

from omrl.cli.main import cli
from omrl.errors import UsageError
from omrl.store import Store
from omrl.store import search as S
from omrl.store.query import QueryError

# Words of several scripts and case rules (Turkish dotted I, German sharp s, Greek final sigma, CJK), words
# joined by punctuation and underscore, digits, and tokens longer than the index keeps whole: two that share
# their cut term (ASCII) and two non-ASCII ones cut inside a character (2-byte letters, odd byte limit).
VOCAB = ["alpha", "beta", "Gamma", "delta", "naïve", "Straße", "İstanbul", "ıspanak", "ΟΔΟΣ", "東京", "Ünïcode",
         "foo_bar", "os.path", "don't", "x1", "42", "Error", "error", "ERROR", "segfault", "hel", "lo",
         "q" * 80, "q" * 81, "a" + "ж" * 40 + "x", "a" + "ж" * 40 + "y", "🙂", "é", "e\u0301"]
HUGE = "z" * 70_000  # over tantivy's own term limit (65,530 bytes), which drops such a token


def _content(rng: random.Random) -> str | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    if roll < 0.08:
        return ""
    words = rng.choices(VOCAB, k=rng.randint(1, 12))
    return "".join(w + rng.choice([" ", "  ", ", ", "\n", "-", "."]) for w in words).strip()


def _rows(rng: random.Random, start: int, n: int) -> list[dict]:
    rows = []
    for i in range(start, start + n):
        row = make_trajectory(i).to_row()
        row["messages"] = [{"role": rng.choice(["system", "user", "assistant", "tool"]), "content": _content(rng)}
                           for _ in range(rng.randint(0, 7))]
        rows.append(row)
    rows[1]["messages"].append({"role": "tool", "content": f"blob {HUGE} end"})
    # Two messages that only hold "hello" / "alpha omega" when glued together, in one trajectory.
    rows[0]["messages"] = [{"role": "user", "content": "say hel"}, {"role": "assistant", "content": "lo there"},
                           {"role": "user", "content": "the alpha"}, {"role": "assistant", "content": "omega"}]
    return rows


@pytest.fixture
def corpus(tmp_path: Path) -> Store:
    """Three parts: two indexed, the third without an index (as after a crash between part and index)."""
    rng = random.Random(7)
    store = Store.create(tmp_path / "store")
    for start in (0, 60, 120):
        appended = store.append(_rows(rng, start, 60))
        if start == 120:
            S.remove_index(appended.part)
        elif not S._usable(appended.part):  # the store's append may have built it already
            S.build_index(appended.part)
    return store


def _stored_rows(store: Store) -> list[dict]:
    """The store's rows, read once per state of its parts (the brute force runs for many queries)."""
    key = (store.path, tuple(store.parts()))
    if _ROWS.get("key") != key:
        _ROWS.update(key=key, rows=store.read().to_pylist())
    return _ROWS["rows"]


_ROWS: dict = {}


def _brute_force(store: Store, query: str) -> list[tuple[str, int]]:
    """Written apart from omrl.store.search: every message of every row, tokenised here."""
    def tokens(text: str) -> list[str]:
        return re.findall(r"\w+", text.lower())

    terms = [t[1:-1] if t.startswith('"') else t for t in re.findall(r'"[^"]*"|[^\s"]+', query)]
    groups = [tokens(t) for t in terms if tokens(t)]
    hits = []
    for row in _stored_rows(store):
        for position, message in enumerate(row["messages"]):
            have = tokens(message["content"] or "")
            if all(any(have[i:i + len(g)] == g for i in range(len(have))) for g in groups):
                hits.append((row["id"], position))
    return sorted(hits)


def _keys(table) -> list[tuple[str, int]]:
    return list(zip(table.column("trajectory_id").to_pylist(), table.column("position").to_pylist(), strict=True))


def _queries(store: Store, rng: random.Random) -> list[str]:
    """Random words and phrases drawn from the stored text, and ones absent from it."""
    texts = [m["content"] for r in store.read().to_pylist() for m in r["messages"] if m["content"]]
    tokens = sorted({t for text in texts for t in S.tokenize(text)})
    queries = rng.sample(tokens, 25)
    queries += [" ".join(rng.sample(tokens, 2)) for _ in range(10)]
    for text in rng.sample(texts, 15):  # consecutive tokens of one message: a phrase that is present
        have = S.tokenize(text)
        if len(have) >= 2:
            i = rng.randrange(len(have) - 1)
            queries.append('"' + " ".join(have[i:i + rng.randint(2, 3)]) + '"')
    queries += ['"beta alpha"', '"alpha alpha"', "zebra", "alphabet", "alpha zebra", '"no such words"']
    queries += ["hello", '"alpha omega"', "İSTANBUL", "straße STRASSE", "ΟΔΟΣ", "東京", "foo_bar", "foo bar",
                "os.path", "don't", "x1 42", "q" * 80, "q" * 79, "q" * 81, "q" * 82, f'"alpha {"q" * 80}"',
                "a" + "ж" * 40 + "x", "A" + "Ж" * 40 + "Z", "e\u0301", "🙂 alpha", "ERROR segfault", HUGE, f'"blob {HUGE} end"',
                "z" * 69_999]
    return queries


def test_indexed_search_equals_the_scan_and_brute_force(corpus):
    queries = _queries(corpus, random.Random(1))
    assert len(queries) > 60
    nonempty = 0
    for query in queries:
        indexed = S.search(corpus, query)
        expected = _brute_force(corpus, query)
        assert _keys(indexed) == expected, query
        assert S.search(corpus, query, use_index=False).equals(indexed), query
        ids_only = S.search(corpus, query, snippets=False)
        assert ids_only.column_names == ["trajectory_id", "position", "role"] and ids_only.equals(indexed.drop_columns(
            ["snippet"])), query
        assert S.search_ids(corpus, query).to_pylist() == sorted({i for i, _ in expected}), query
        nonempty += bool(expected)
    assert nonempty > 40  # the comparison is not between empty results
    for absent in ("zebra", "hello", '"alpha omega"', '"no such words"'):
        assert S.search(corpus, absent).num_rows == 0
    # "alpha omega" exists only across a message boundary; each word alone is found in that trajectory.
    first = corpus.read().column("id")[0].as_py()
    assert (first, 2) in _keys(S.search(corpus, "alpha")) and (first, 3) in _keys(S.search(corpus, "omega"))


def _brute_force_patterns(store: Store, patterns: list[str]) -> list[tuple[str, int]]:
    """Written apart from omrl.store.search: a message is a hit when each pattern (`*`: any characters) matches
    one of its tokens whole."""
    from fnmatch import fnmatchcase

    hits = []
    for row in _stored_rows(store):
        for position, message in enumerate(row["messages"]):
            have = re.findall(r"\w+", (message["content"] or "").lower())
            if all(any(fnmatchcase(token, p.lower()) for token in have) for p in patterns):
                hits.append((row["id"], position))
    return sorted(hits)


@pytest.mark.parametrize("query", ["alp*", "*ta", "*amm*", "foo*", "*_bar", "*oo_ba*", "q*", "*q", "qq*qq",
                                   "a*x", "A*Y", "*ж*", "*z", "z*", "ıs*", "x*", "alp* *ta", "*no_such*"])
def test_patterns_match_inside_tokens_and_the_index_equals_the_scan(corpus, query):
    """A term with `*` matches tokens whole, `*` standing for any word characters: also tokens longer than the
    index keeps (q * 80, a + ж * 40 + x: their cut terms decide nothing alone)."""
    expected = _brute_force_patterns(corpus, query.split())
    indexed = S.search(corpus, query)
    assert _keys(indexed) == expected, query
    assert S.search(corpus, query, use_index=False).equals(indexed), query
    assert S.search_ids(corpus, query).to_pylist() == sorted({i for i, _ in expected}), query
    if query != "*no_such*":
        assert expected, query  # the comparison is not between empty results


def test_a_word_matches_whole_tokens_a_pattern_parts_and_the_cli_says_0_hits(tmp_path):
    store = Store.create(tmp_path / "s")
    row = make_trajectory(0).to_row()
    row["messages"] = [{"role": "assistant", "content": "def is_palindrome(s): return s == s[::-1]"}]
    store.append([row])
    assert S.search(store, "palindrome").num_rows == 0  # whole tokens only
    for pattern in ("*palindrome*", "*palindrome", "is_pal*", "IS_*DROME"):
        hits = S.search(store, pattern).to_pylist()
        assert [(h["position"], "is_palindrome" in h["snippet"]) for h in hits] == [(0, True)], pattern
    assert S.search(store, "*palindrome return").num_rows == 1
    empty = _cli(str(store.path), "--search", "palindrome")
    assert empty.exit_code == 0 and empty.output.startswith("0 hits (words match whole tokens"), empty.output
    found = _cli(str(store.path), "--search", "*palindrome*")
    assert found.exit_code == 0 and "0 hits" not in found.output and "is_palindrome" in found.output


def test_hits_carry_role_snippet_and_deterministic_order(corpus):
    hits = S.search(corpus, "segfault")
    assert hits.column_names == ["trajectory_id", "position", "role", "snippet"]
    assert _keys(hits) == sorted(_keys(hits))
    rows = {r["id"]: r for r in corpus.read().to_pylist()}
    for hit in hits.to_pylist():
        message = rows[hit["trajectory_id"]]["messages"][hit["position"]]
        assert hit["role"] == message["role"]
        assert "segfault" in hit["snippet"].lower() and len(hit["snippet"]) <= S.SNIPPET_CHARS + 2
    phrase_hits = S.search(corpus, 'delta "alpha gamma"').column("snippet").to_pylist()
    assert phrase_hits and all(re.search(r"alpha\W+gamma", snippet.lower()) for snippet in phrase_hits)
    assert S.search(corpus, "segfault", limit=3).equals(hits.slice(0, 3))
    assert S.search(corpus, "segfault", limit=0).num_rows == 0


@pytest.mark.parametrize("query", ["", "   ", "!!! ...", '"unclosed phrase', '""'])
def test_queries_without_words_are_usage_errors(corpus, query):
    with pytest.raises(UsageError):
        S.search(corpus, query)


@pytest.mark.parametrize("limit", [-1, 1.5, True])
def test_bad_limits_are_usage_errors(corpus, limit):
    with pytest.raises(UsageError):
        S.search(corpus, "alpha", limit=limit)


def test_index_lives_beside_its_part_and_outside_the_data(corpus):
    parts = corpus.parts()
    assert [p for p in parts if not (S.index_path(p) / S.META_FILE).is_file()] == S.missing_indexes(corpus)
    assert S.missing_indexes(corpus) == [parts[2]]
    folder = corpus.table_dir("trajectories")
    assert not [p for p in folder.iterdir() if ".building-" in p.name]  # no temporary folder left
    card = (corpus.path / "README.md").read_text()
    assert ".search" not in card and all(p.name in card for p in parts)
    assert S.build_missing(corpus) == 1 and S.missing_indexes(corpus) == []
    assert corpus.parts() == parts  # the index folders are not parts
    meta = (S.index_path(parts[0]) / S.META_FILE).read_text()
    assert S.build_index(parts[0]) == S.index_path(parts[0])  # built again (a racing writer): one index kept
    assert (S.index_path(parts[0]) / S.META_FILE).read_text() == meta
    assert not [p for p in folder.iterdir() if ".building-" in p.name] and S.missing_indexes(corpus) == []


def _index_hits(part, words=("alpha", "segfault", "東京", "x1", "zebra", "ıspanak", '"beta gamma"', "q" * 80)) -> dict:
    return {w: S._indexed_hits(part, S._open(part), S.parse_query(w)).to_pylist() for w in words}


def test_index_rebuilt_is_the_same(corpus):
    part = corpus.parts()[0]
    before = _index_hits(part)
    assert sum(map(len, before.values())) > 0
    files = {name: pq.read_table(S.index_path(part) / name) for name in (S.MESSAGES_FILE, S.ROWS_FILE)}
    S.remove_index(part)
    assert not S.index_path(part).exists() and part in S.missing_indexes(corpus)
    S.build_index(part)
    assert _index_hits(part) == before
    assert all(pq.read_table(S.index_path(part) / name).equals(table) for name, table in files.items())
    S.remove_index(part)
    S.remove_index(part)  # removing twice is fine


def test_parts_whose_text_pages_fell_back_to_plain_are_indexed_alike(corpus, tmp_path):
    """Texts past a small dictionary page limit (v1 parts: Arrow's 1 MB) are in plain pages, not the
    dictionary the index reads a row group's texts from: they are numbered and found all the same."""
    store = Store.create(tmp_path / "plain-pages")
    part = store.table_dir("trajectories") / corpus.parts()[0].name
    pq.write_table(pq.read_table(corpus.parts()[0]), part, row_group_size=20, dictionary_pagesize_limit=64,
                   data_page_size=64)
    assert store.repair().adopted == [str(part)]
    S.build_index(part)
    for query in ("alpha", "segfault", '"beta gamma"', "q" * 80, "東京 x1", "zebra"):
        assert S.search(store, query).equals(S.search(store, query, use_index=False)), query
        assert _keys(S.search(store, query)) == _brute_force(store, query), query


def test_index_built_in_small_chunks_is_the_same(corpus, monkeypatch):
    part = corpus.parts()[0]
    before = _index_hits(part)
    files = {name: pq.read_table(S.index_path(part) / name) for name in (S.MESSAGES_FILE, S.ROWS_FILE)}
    monkeypatch.setattr(S, "TOKENISE_CHUNK_BYTES", 300)  # a chunk or two of texts at a time
    assert len(S._chunks(S.part_messages(part)[0].dictionary, 300)) > 20
    S.remove_index(part)
    S.build_index(part)
    assert _index_hits(part) == before
    assert all(pq.read_table(S.index_path(part) / name).equals(table) for name, table in files.items())


TEXTS = ["Hello, World_x 42!", "tab\there\x00nul\x7fdel", "naïve Straße", "İstanbul ıi", "ΟΔΟΣ ὀδός", "東京タワー",
         "x²½", "e\u0301", "", "🙂a🙂", "KELVIN \u212a", "q" * 64 + " " + "Q" * 65, "a" + "ж" * 40, "東" * 30 + "!",
         "\u3000ideographic\u00a0nbsp\u2028line\u2029para\x1cfs"]


@pytest.mark.parametrize("text", TEXTS)
def test_index_terms_equal_the_tokeniser(text):
    terms = [S.index_term(t) for t in S.tokenize(text)]
    assert [t.split() for t in S.token_texts([text, None])] == [terms, []]
    assert S.analyzer().analyze(S.token_texts([text])[0]) == terms  # tantivy splits them the same way
    assert all(len(t.encode()) <= S.MAX_TERM_BYTES + len(S.CUT_MARK.encode()) for t in terms)
    for token, term in zip(S.tokenize(text), terms, strict=True):  # a cut term is a prefix, never a whole token
        assert term == token if len(token.encode()) <= S.MAX_TERM_BYTES else (
            term.endswith(S.CUT_MARK) and token.startswith(term[:-1]) and S.TOKEN.fullmatch(term) is None)


def test_token_texts_of_an_arrow_array_equal_the_tokeniser():
    import pyarrow as pa

    # ASCII runs longer than a term right at text boundaries, a null, non-ASCII texts, a sliced array
    texts = ["x" * 40, "y" * 40 + " ok", None, "", "Tail " + "W" * 65, "V" * 65, "naïve " + "é" * 40, "A-b_c 9"] * 3
    array = pa.array(["skipped", *texts, "skipped too"], pa.string()).slice(1, len(texts))
    expected = [" ".join(S.index_term(t) for t in S.tokenize(text or "")) for text in texts]
    assert [t.split() for t in S.token_texts(array)] == [e.split() for e in expected]
    assert [t.split() for t in S.token_texts(pa.chunked_array([array.slice(0, 5), array.slice(5)]))] == \
        [e.split() for e in expected]


def test_long_tokens_are_found_at_every_offset_and_length():
    """Tokens of 60-140 word bytes after 0-40 bytes of other text, beside texts of every length: each long
    one is cut as `tokenize` cuts it, wherever it falls against the 32-byte blocks the fast check reads."""
    import pyarrow as pa

    texts = [("a b" * 20)[:offset] + " " + "K" * length + (" tail" if length % 2 else "")
             for offset in range(41) for length in range(60, 141, 7)]
    texts += ["z" * n for n in range(100)]  # short and long single-token texts, back to back
    texts += ["w" * 31 + " " + "w" * 33]  # space-free stretches across the block edges, no long token
    expected = [[S.index_term(t) for t in S.tokenize(text)] for text in texts]
    for array in (pa.array(texts), pa.array(texts, pa.large_string()), pa.array(["pad", *texts]).slice(1)):
        assert [t.split() for t in S.token_texts(array)] == expected


@pytest.mark.parametrize("positions", [False, True])
def test_phrases_with_and_without_positions(corpus, monkeypatch, positions):
    monkeypatch.setattr(S, "POSITIONS", positions)
    for part in corpus.parts():
        S.remove_index(part)
        S.build_index(part)
        assert json.loads((S.index_path(part) / S.META_FILE).read_text())["positions"] is positions
    for query in ['"alpha beta"', '"beta alpha" gamma', '"alpha omega"', '"don\'t"', "os.path", "alpha", "zebra"]:
        assert S.search(corpus, query).equals(S.search(corpus, query, use_index=False)), query
        assert _keys(S.search(corpus, query)) == _brute_force(corpus, query), query
    phrases = ['"beta gamma"', "os.path", '"alpha alpha"']
    expected = {q: S.search(corpus, q, use_index=False).drop_columns(["snippet"]) for q in phrases}
    calls = _no_text_reads(monkeypatch)
    for query in phrases:
        assert S.search(corpus, query, snippets=False).equals(expected[query]), query
    # with positions a phrase is answered by the index alone; without, its candidates' texts are checked
    assert (calls == []) is positions


def test_every_message_with_a_token_is_indexed_once(corpus):
    part = corpus.parts()[0]
    table = pq.read_table(part)
    expected = sorted((r, p, m["role"]) for r, row in enumerate(table.column("messages").to_pylist())
                      for p, m in enumerate(row) if S.tokenize(m["content"] or ""))
    messages = pq.read_table(S.index_path(part) / S.MESSAGES_FILE)
    got = sorted(zip(messages.column("row").to_pylist(), messages.column("position").to_pylist(),
                     messages.column("role").to_pylist(), strict=True))
    assert got == expected
    assert pq.read_table(S.index_path(part) / S.ROWS_FILE).column("id").equals(table.column("id"))
    meta = json.loads((S.index_path(part) / S.META_FILE).read_text())
    assert meta["version"] == S.INDEX_VERSION and meta["rows"] == table.num_rows


def _no_text_reads(monkeypatch) -> list:
    """Make every read of message text fail, except `message_texts` calls, which are recorded."""
    calls = []
    real = S.message_texts

    def recorded(part, rows, positions):
        calls.append(len(rows))
        return real(part, rows, positions)

    def refused(*args, **kwargs):
        raise AssertionError("an indexed search read a whole part")

    monkeypatch.setattr(S, "message_texts", recorded)
    monkeypatch.setattr(S, "_row_group_messages", refused)  # the one reader of a whole part
    return calls


def test_an_indexed_search_reads_no_text_to_decide(corpus, monkeypatch):
    S.build_missing(corpus)
    queries = ["alpha", "segfault", "東京 x1", "zebra", "ıspanak"]  # words; phrases: the positions test
    long_query = "q" * 80  # cut in the index
    expected = {q: S.search(corpus, q, use_index=False) for q in [*queries, long_query]}
    calls = _no_text_reads(monkeypatch)
    for query in queries:
        assert S.search(corpus, query, snippets=False).equals(expected[query].drop_columns(["snippet"])), query
        assert S.search_ids(corpus, query).to_pylist() == sorted(set(expected[query].column("trajectory_id").to_pylist()))
    assert calls == []  # hits came from the index alone
    assert S.search(corpus, "alpha", limit=3).equals(expected["alpha"].slice(0, 3))
    assert 0 < sum(calls) <= 3  # only the snippets of the hits returned were read
    calls.clear()
    assert S.search(corpus, long_query, snippets=False).equals(expected[long_query].drop_columns(["snippet"]))
    assert expected[long_query].num_rows > 0
    cut_share = sum(calls)  # a cut term: only the candidate texts were read and checked
    monkeypatch.undo()
    # the candidates are the distinct texts of each part holding a token cut to the same term: q*80 or q*81
    candidates = sum(len({m["content"] for row in pq.read_table(p).column("messages").to_pylist() for m in row
                          if re.search(r"(?<!\w)q{80,81}(?!\w)", (m["content"] or "").lower())}) for p in corpus.parts())
    texts = sum(json.loads((S.index_path(p) / S.META_FILE).read_text())["texts"] for p in corpus.parts())
    assert cut_share == candidates and 0 < candidates < texts / 2


def test_snippets_and_checks_read_the_right_messages_of_many_row_groups(corpus, tmp_path):
    """A part of 7-row groups: the texts read for snippets and for cut terms' checks come from the right rows."""
    store = Store.create(tmp_path / "small-groups")
    part = store.table_dir("trajectories") / corpus.parts()[0].name
    pq.write_table(pq.read_table(corpus.parts()[0]), part, row_group_size=7)
    assert store.repair().adopted == [str(part)]  # a part copied in from another store: listed by the repair
    assert pq.ParquetFile(part).metadata.num_row_groups > 5 and store.parts() == [part]
    S.build_index(part)
    for query in ("alpha", "segfault", '"beta gamma"', "q" * 80, "東京 x1"):
        assert S.search(store, query).equals(S.search(store, query, use_index=False)), query
        assert S.search(store, query, limit=2).equals(S.search(store, query, use_index=False, limit=2)), query


def test_searches_from_many_threads_share_the_opened_indexes(corpus):
    from concurrent.futures import ThreadPoolExecutor

    queries = ["alpha", "segfault", '"beta gamma"', "東京", "zebra"] * 4
    expected = {q: S.search(corpus, q, use_index=False) for q in set(queries)}
    S._opened.clear()
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda q: S.search(corpus, q), queries))
    assert all(result.equals(expected[q]) for q, result in zip(queries, results, strict=True))
    assert len(S._opened) == 2  # the two indexed parts: kept for the next search (the third has no index)


def test_index_of_an_older_format_is_scanned_and_rebuilt(corpus):
    part = corpus.parts()[0]
    meta_path = S.index_path(part) / S.META_FILE
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "version": S.INDEX_VERSION - 1}))
    assert part in S.missing_indexes(corpus)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an index of another format is not used, silently
        assert _keys(S.search(corpus, "alpha")) == _brute_force(corpus, "alpha")
    assert S.build_missing(corpus) == 2 and S.missing_indexes(corpus) == []
    assert json.loads(meta_path.read_text())["version"] == S.INDEX_VERSION


def test_compaction_orphans_and_dead_builders_are_cleaned(corpus):
    before = {q: _keys(S.search(corpus, q)) for q in ("alpha", '"beta gamma"', "東京")}
    old = corpus.parts()
    dead = corpus.table_dir("trajectories") / f"{S.index_path(old[0]).name}.building-999999999-0123abcd"
    dead.mkdir()  # a builder that was killed (its pid does not exist)
    merged = corpus.compact()
    S.remove_index(merged)  # as when a crash came between the compaction and its index
    assert S.missing_indexes(corpus) == corpus.parts() == [merged]  # scanned until it is built
    assert {q: _keys(S.search(corpus, q)) for q in before} == before
    assert S.build_missing(corpus) == 1
    left = [p.name for p in corpus.table_dir("trajectories").iterdir() if S.INDEX_SUFFIX in p.name]
    assert left == [S.index_path(merged).name]  # the replaced parts' indexes and the dead builder's folder are gone
    assert {q: _keys(S.search(corpus, q)) for q in before} == before


def test_damaged_or_stale_index_falls_back_to_the_scan(corpus):
    part = corpus.parts()[0]
    expected = _keys(S.search(corpus, "alpha", use_index=False))
    for path in S.index_path(part).iterdir():
        if path.name != S.META_FILE:
            path.write_bytes(b"damaged")
    with pytest.warns(S.SearchIndexWarning):
        assert _keys(S.search(corpus, "alpha")) == expected
    S.remove_index(part)
    meta_path = S.index_path(corpus.parts()[1]) / S.META_FILE
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "part_bytes": meta["part_bytes"] + 1}))  # built from another file
    assert corpus.parts()[1] in S.missing_indexes(corpus)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an index that does not fit is not used, silently
        assert _keys(S.search(corpus, "beta")) == _keys(S.search(corpus, "beta", use_index=False))


def test_index_of_another_tantivy_version_is_rebuilt(corpus):
    part = corpus.parts()[0]
    meta_path = S.index_path(part) / S.META_FILE
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "tantivy": "tantivy v0.1.0, index_format v1"}))
    assert part in S.missing_indexes(corpus)
    assert _keys(S.search(corpus, "alpha")) == _brute_force(corpus, "alpha")  # scanned meanwhile
    assert S.build_missing(corpus) == 2 and S.missing_indexes(corpus) == []  # with the unindexed third part
    assert json.loads(meta_path.read_text())["tantivy"] == meta["tantivy"]


def test_empty_part_and_store(tmp_path):
    store = Store.create(tmp_path / "empty")
    assert S.search(store, "alpha").num_rows == 0
    row = make_trajectory(0).to_row()
    row["messages"] = []
    S.build_index(store.append([row]).part)
    assert S.missing_indexes(store) == [] and S.search(store, "alpha").num_rows == 0


def _cli(*args: str):
    return CliRunner().invoke(cli, ["query", *args], catch_exceptions=False)


def test_cli_search_prints_hits_and_joins_in_sql(corpus):
    path = str(corpus.path)
    result = _cli(path, "--search", "segfault", "--format", "json")
    assert result.exit_code == 0, result.output
    printed = [json.loads(line) for line in result.output.splitlines()]
    assert printed == S.search(corpus, "segfault").to_pylist()
    sql = ("SELECT h.trajectory_id, h.position, m.content FROM search_hits h JOIN messages m "
           "ON m.trajectory_id = h.trajectory_id AND m.position = h.position ORDER BY 1, 2")
    result = _cli(path, "--search", "segfault", sql, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert [(r["trajectory_id"], r["position"]) for r in rows] == _keys(S.search(corpus, "segfault"))
    assert all("segfault" in r["content"].lower() for r in rows)
    assert _cli(path, "--format", "json").exit_code != 0  # neither SQL nor --search
    bad = _cli(path, "--search", '"open')
    assert bad.exit_code != 0 and "unclosed quote" in bad.output


@pytest.mark.parametrize("sql", [
    "SELECT * FROM read_csv('/etc/passwd')",
    "COPY (SELECT * FROM search_hits) TO 'out.csv'",
    "SELECT * FROM search_hits; SET enable_external_access = true",
])
def test_search_view_keeps_the_connection_confined(corpus, sql, tmp_path):
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with S.hits_view(corpus, "alpha") as con:
            from omrl.store.query import run_query

            assert run_query(corpus, "SELECT count(*) AS n FROM search_hits", con=con).column("n")[0].as_py() > 0
            with pytest.raises(QueryError):
                run_query(corpus, sql, con=con)
            with pytest.raises(Exception, match="(?i)permission|disabled|lock"):
                con.execute("SET enable_external_access = true")
        assert not (tmp_path / "out.csv").exists()
    finally:
        os.chdir(cwd)


def test_store_check_names_unindexed_parts_and_repair_builds_them(corpus):
    before = _keys(S.search(corpus, "alpha"))
    unindexed = S.missing_indexes(corpus)
    assert len(unindexed) == 1  # the fixture's third part
    checked = CliRunner().invoke(cli, ["store", "check", str(corpus.path)])
    assert checked.exit_code == 0, checked.output  # scanned parts are information, not a problem
    assert "1 part(s) without an index are scanned" in checked.output
    repaired = CliRunner().invoke(cli, ["store", "check", str(corpus.path), "--repair"])
    assert repaired.exit_code == 0, repaired.output
    assert "1 missing index(es) built" in repaired.output and "without an index" not in repaired.output
    assert S.missing_indexes(corpus) == [] and _keys(S.search(corpus, "alpha")) == before


def test_compaction_without_the_index_leaves_it_for_later_with_the_same_hits(corpus):
    before = {q: _keys(S.search(corpus, q)) for q in ("alpha", '"beta gamma"', "東京")}
    merged = corpus.compact(index=False)
    assert S.missing_indexes(corpus) == corpus.parts() == [merged]  # not built: searches scan it
    assert {q: _keys(S.search(corpus, q)) for q in before} == before
    assert S.build_missing(corpus) == 1  # built afterwards, on its own
    assert S.missing_indexes(corpus) == []
    assert {q: _keys(S.search(corpus, q)) for q in before} == before


def test_store_compact_no_index_flag(corpus):
    result = CliRunner().invoke(cli, ["store", "compact", str(corpus.path), "--table", "trajectories", "--no-index"])
    assert result.exit_code == 0, result.output
    assert len(corpus.parts()) == 1 and S.missing_indexes(corpus) == corpus.parts()
    result = CliRunner().invoke(cli, ["store", "compact", str(corpus.path), "--table", "trajectories"])
    assert result.exit_code == 0, result.output
    assert S.missing_indexes(corpus) == []  # a plain compact indexes what it left unindexed
