#!/usr/bin/env python3
"""Reference tokenizer ids for a GGUF file's gpt2 (byte-level BPE) vocabulary.

Builds a Hugging Face `tokenizers.Tokenizer` from the GGUF metadata alone
(tokenizer.ggml.tokens / merges / token_type), tokenizes every case of a JSON
Lines corpus (one {"text": ...} object per line) and writes the ids as JSON.

    python3 tests/golden/tokenizer_golden.py MODEL.gguf tests/golden/tokenizer_corpus.jsonl OUT.json

How the tokenizer is built (this is what tokenizer.ggml.pre = "smollm" means,
and what SmolLM2's own tokenizer.json says):
  * model: BPE over the GGUF vocabulary and merges, byte-level, no unk token,
    no dropout, no byte fallback; no normalizer;
  * pre-tokenizer: Sequence[Digits(individual_digits=True),
    ByteLevel(add_prefix_space=False, use_regex=True)] -- every Unicode number
    character (general category N) becomes its own piece, then the GPT-2 regex
    's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+
    splits the rest, then bytes are mapped to GPT-2's printable alphabet;
  * special tokens: every token of token_type 3 (control) is an added special
    token, matched verbatim in the raw text (not normalized, no lstrip/rstrip);
  * decoder: ByteLevel.  No BOS/EOS is added (tokenizer.ggml.add_bos_token is false).

For each case two id lists are recorded: `ids` (special-token strings in the
text are recognised as the special tokens) and `ids_plain` (they are not:
the text is tokenized as ordinary text, tokenizers' encode_special_tokens).
"""
import argparse
import datetime
import hashlib
import json
import os
import sys
import unicodedata

import numpy as np  # noqa: F401  (gguf needs it; imported for the version record)
import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

TOKEN_TYPE_CONTROL = 3


def field(reader, key):
    f = reader.fields.get(key)
    if f is None:
        raise KeyError(f"GGUF key {key!r} is missing")
    return f.contents()


def build_tokenizer(reader):
    """Returns (tokenizer, special_ids, special_strings) built from GGUF metadata only."""
    model_name = field(reader, "tokenizer.ggml.model")
    pre = field(reader, "tokenizer.ggml.pre")
    if model_name != "gpt2" or pre != "smollm":
        raise ValueError(f"expected tokenizer gpt2/smollm, got {model_name}/{pre}")
    tokens = field(reader, "tokenizer.ggml.tokens")
    merges_raw = field(reader, "tokenizer.ggml.merges")
    token_type = field(reader, "tokenizer.ggml.token_type")
    if len(tokens) != len(token_type):
        raise ValueError("tokens and token_type differ in length")
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("duplicate strings in tokenizer.ggml.tokens")
    merges = []
    for m in merges_raw:
        parts = m.split(" ")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"merge {m!r} is not 'a b'")
        merges.append((parts[0], parts[1]))

    bpe = models.BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                     fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()

    special_ids = [i for i, t in enumerate(token_type) if t == TOKEN_TYPE_CONTROL]
    special_strings = [tokens[i] for i in special_ids]
    tok.add_special_tokens([
        AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False,
                   single_word=False) for s in special_strings])
    # adding them must not have created new ids
    for i, s in zip(special_ids, special_strings):
        if tok.token_to_id(s) != i:
            raise ValueError(f"special token {s!r} did not keep id {i}")
    if tok.get_vocab_size(with_added_tokens=True) != len(tokens):
        raise ValueError("vocabulary size changed when adding special tokens")
    return tok, special_ids, special_strings


def encode(tok, text, plain):
    tok.encode_special_tokens = plain
    try:
        return tok.encode(text, add_special_tokens=False).ids
    finally:
        tok.encode_special_tokens = False


def self_check(tok, special_ids):
    """Sanity checks of the construction; raise on any surprise."""
    vocab = tok.get_vocab()
    def ids_of(pieces):
        return [vocab[p] for p in pieces]
    checks = {
        "Hello world": ids_of(["Hello", "Ġworld"]),
        "12345": ids_of(["1", "2", "3", "4", "5"]),
        " 42": ids_of(["Ġ", "4", "2"]),
        "don't": ids_of(["don", "'t"]),
    }
    for text, want in checks.items():
        got = encode(tok, text, plain=False)
        if got != want:
            raise AssertionError(f"self-check {text!r}: got {got}, want {want}")
    got = encode(tok, "hi<|im_end|>there", plain=False)
    im_end = tok.token_to_id("<|im_end|>")
    if im_end not in got or im_end not in special_ids:
        raise AssertionError("<|im_end|> was not recognised as a special token")
    plain = encode(tok, "<|im_end|>", plain=True)
    if im_end in plain or len(plain) < 2 or any(i in special_ids for i in plain):
        raise AssertionError(f"encode_special_tokens did not split <|im_end|>: {plain}")
    if tok.decode(plain, skip_special_tokens=False) != "<|im_end|>":
        raise AssertionError("plain pieces of <|im_end|> do not decode back")


_ESCAPE_CATEGORIES = {"Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn", "Cs"}


def _needs_escape(ch):
    o = ord(ch)
    # ASCII below DEL: json.dumps already escaped what needs it inside strings, and
    # what is left raw (newlines, spaces) is the layout.  Non-BMP stays raw UTF-8,
    # so that no surrogate-pair escapes are written.
    if o < 0x7F or o > 0xFFFF:
        return False
    if 0x0300 <= o <= 0x036F or 0xFE00 <= o <= 0xFE0F:  # combining diacritics, variation selectors
        return True
    return unicodedata.category(ch) in _ESCAPE_CATEGORIES


def readable_json(obj, indent=None):
    """json.dumps with raw UTF-8, except invisible BMP characters, which become \\uXXXX."""
    s = json.dumps(obj, ensure_ascii=False, indent=indent)
    return "".join(f"\\u{ord(c):04x}" if _needs_escape(c) else c for c in s)


def dumps_one_item_per_line(obj):
    """Top-level object indented; each element of a top-level list on one compact line."""
    parts = []
    for key, value in obj.items():
        k = json.dumps(key)
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n  ".join(readable_json(v) for v in value)
            parts.append(f" {k}: [\n  {rows}\n ]")
        elif isinstance(value, dict):
            inner = readable_json(value, indent=2).replace("\n", "\n ")
            parts.append(f" {k}: {inner}")
        else:
            parts.append(f" {k}: {readable_json(value)}")
    return "{\n" + ",\n".join(parts) + "\n}"


def pretty_json(obj, indent=1, level=0):
    """Objects indented one key a line; lists of scalars (ids, numbers) on one line."""
    pad, inner = " " * (indent * level), " " * (indent * (level + 1))
    if isinstance(obj, dict):
        if not obj:
            return "{}"
        items = [f"{inner}{readable_json(str(k))}: {pretty_json(v, indent, level + 1)}"
                 for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [inner + pretty_json(v, indent, level + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad + "]"
    return readable_json(obj)


def write_pretty_json(path, obj):
    """Writes obj as pretty_json, UTF-8, with a final newline."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(pretty_json(obj) + "\n")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def package_versions():
    return {"python": sys.version.split()[0], "gguf": _version("gguf"),
            "numpy": np.__version__, "tokenizers": tokenizers.__version__}


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="GGUF file")
    ap.add_argument("corpus", help="JSON Lines file, one {\"text\": ...} per line")
    ap.add_argument("out", help="output JSON file")
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.model)
    tok, special_ids, special_strings = build_tokenizer(reader)
    print(f"{len(special_ids)} special tokens: " +
          ", ".join(f"{i}={s}" for i, s in zip(special_ids, special_strings)))
    self_check(tok, special_ids)

    cases = []
    with open(args.corpus, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            text = json.loads(line)["text"]
            ids = encode(tok, text, plain=False)
            ids_plain = encode(tok, text, plain=True)
            decoded = tok.decode(ids, skip_special_tokens=False)
            decoded_plain = tok.decode(ids_plain, skip_special_tokens=False)
            if decoded != text or decoded_plain != text:
                raise AssertionError(f"line {lineno}: {text!r} does not round-trip: "
                                     f"{decoded!r} / {decoded_plain!r}")
            if any(i in special_ids for i in ids_plain):
                raise AssertionError(f"line {lineno}: a special id in ids_plain")
            cases.append({"text": text, "ids": ids, "ids_plain": ids_plain, "decoded": decoded})
    print(f"{len(cases)} cases, all round-trip")

    out = {
        "provenance": {
            "model_file": os.path.basename(args.model),
            "model_sha256": sha256_of(args.model),
            "corpus_file": os.path.basename(args.corpus),
            "corpus_sha256": sha256_of(args.corpus),
            "script": "tests/golden/tokenizer_golden.py",
            "packages": package_versions(),
            "date": datetime.date.today().isoformat(),
            "tokenizer": ("tokenizers.Tokenizer built from GGUF metadata only: BPE(vocab="
                          "tokenizer.ggml.tokens, merges=tokenizer.ggml.merges, no unk, no dropout, "
                          "no byte fallback), no normalizer, pre_tokenizer Sequence[Digits("
                          "individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)], "
                          "decoder ByteLevel; token_type 3 (control) tokens added as special tokens "
                          "(normalized=False, lstrip=rstrip=False); no BOS/EOS added"),
            "ids": "special-token strings in the text recognised as special tokens",
            "ids_plain": "special-token strings tokenized as ordinary text (encode_special_tokens=True)",
            "decoded": "tokenizer.decode(ids, skip_special_tokens=False); equals text for every case",
            "json_text": "UTF-8; invisible BMP characters written as \\uXXXX; no surrogate-pair escapes",
        },
        "special_ids": special_ids,
        "special_tokens": special_strings,
        "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(dumps_one_item_per_line(out) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
