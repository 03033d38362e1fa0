"""Tokenizer built from GGUF metadata, giving llama.cpp's token ids (llama-vocab.cpp).

Two vocab kinds, as llama.cpp names them by `tokenizer.ggml.model`:
  * "gpt2"  (BPE): byte-level BPE; the text is first split by the pre-tokenizer regexes of
    `tokenizer.ggml.pre` (applied one after the other, each one splitting the pieces of the
    previous one, matches and the gaps between them both kept: llama.cpp's
    unicode_regex_split), then each piece is byte-mapped (GPT-2 bytes_to_unicode) and merged by
    merge rank. The merge engine is HF `tokenizers`' BPE model.
  * "llama" (SPM): SentencePiece-style; spaces become U+2581, a space is prefixed to the first
    text fragment (add_space_prefix), pairs of adjacent symbols whose concatenation is a token
    are merged highest score first (leftmost on ties), characters that are no token become
    <0xNN> byte tokens. Done by HF BPE with merges ranked by the merged token's score and
    byte_fallback (equal to llama.cpp's loop except for ties in score between different
    merges, and for characters absent from the vocab that llama.cpp could still merge: both
    are absent from real SentencePiece vocabs).

Special tokens (llama.cpp's tokenizer_st_partition): control, user-defined and unknown tokens
are cut out of the text longest first before the model sees it; with parse_special=False only
user-defined tokens are (llama.cpp's behaviour), so "<|im_start|>" is then plain text.
Decoding is llama.cpp's llama_detokenize(remove_special=False, unparse_special=special):
control/unknown tokens are omitted unless special=True, clean_spaces per pre-tokenizer.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any

from minfer.errors import BadInput, BadModel, Unsupported

# token_type values of tokenizer.ggml.token_type (llama.cpp llama_token_type)
T_UNDEFINED, T_NORMAL, T_UNKNOWN, T_CONTROL, T_USER_DEFINED, T_UNUSED, T_BYTE = range(7)
# the types whose texts are cut out of a prompt before the model sees it
_SPECIAL_TYPES = frozenset({T_CONTROL, T_USER_DEFINED, T_UNKNOWN})

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's rewrite of Tekken's (Mistral Nemo and later) regex: "upper" = a letter not a-z
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
    r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class _Pre:
    """One llama.cpp pre-tokenizer type: its regex list and the flags it sets."""

    regexes: tuple[str, ...]
    clean_spaces: bool = True
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default when the metadata has no add_bos_token


_STARCODER = _Pre((r"\p{N}", _GPT2))
_PRE: dict[str, _Pre] = {
    # LLAMA_VOCAB_PRE_TYPE_DEFAULT
    "default": _Pre((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")),
    # LLAMA_VOCAB_PRE_TYPE_LLAMA3
    **{
        k: _Pre((_LLAMA3,), ignore_merges=True, add_bos=True)
        for k in ("llama3", "llama-v3", "llama-bpe", "falcon3")
    },
    "dbrx": _Pre((_LLAMA3,)),
    "smaug-bpe": _Pre((_LLAMA3,)),
    # LLAMA_VOCAB_PRE_TYPE_GPT2 (and MPT, OLMO, JAIS share its regex)
    **{k: _Pre((_GPT2,)) for k in ("gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais")},
    # LLAMA_VOCAB_PRE_TYPE_STARCODER family: every digit isolated, then GPT-2
    "starcoder": _STARCODER,
    "refact": _STARCODER,
    "codeshell": _STARCODER,
    "exaone": _STARCODER,
    "minerva-7b": _STARCODER,
    "command-r": _Pre(_STARCODER.regexes, clean_spaces=False),
    "smollm": _Pre(_STARCODER.regexes, clean_spaces=False),
    # LLAMA_VOCAB_PRE_TYPE_QWEN2
    "qwen2": _Pre((_QWEN2,), clean_spaces=False),
    "stablelm2": _Pre((_QWEN2,)),
    "megrez": _Pre((_QWEN2,)),
    # LLAMA_VOCAB_PRE_TYPE_TEKKEN (newer Mistral files)
    "tekken": _Pre((_TEKKEN,), clean_spaces=False, ignore_merges=True, add_bos=True),
    # LLAMA_VOCAB_PRE_TYPE_FALCON
    "falcon": _Pre((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]")),
}

# host memory to build the HF tokenizer, per token and merge (~215 B measured on SmolLM2's 49k
# + 49k; twice that and more for the allocator's slack)
BUILD_BYTES_PER_ENTRY = 512

# llama.cpp forces these texts to CONTROL (end-of-generation detection in llama_vocab::load)
_EOG_TEXTS = frozenset(
    {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>"}
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (llama.cpp unicode_byte_to_utf8)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


def _meta_list(meta: Mapping[str, Any], key: str, required: bool = True) -> list | None:
    v = meta.get(key)
    if v is None:
        if required:
            raise BadModel(f"tokenizer: metadata key {key!r} missing")
        return None
    if not isinstance(v, (list, tuple)):
        raise BadModel(f"tokenizer: metadata key {key!r} is not an array ({type(v).__name__})")
    return list(v)


def _meta_id(meta: Mapping[str, Any], key: str, default: int | None, n: int) -> int | None:
    v = meta.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):  # "3", 2.5 or True: a damaged file
        raise BadModel(f"tokenizer: metadata key {key!r} = {ascii(v)[:60]} is not an integer")
    # llama.cpp: an out-of-range special id is ignored with a warning (the default is kept)
    return v if 0 <= v < n else default


def _meta_bool(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    """A GGUF bool flag (llama.cpp reads it as a bool: "yes" or 1 is a damaged file)."""
    v = meta.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadModel(
            f"tokenizer: metadata key {key!r} = {ascii(v)[:60]} must be a bool, "
            f"not {type(v).__name__}"
        )
    return v


_C_SPACE = " \t\n\v\f\r"  # C isspace()


def _rstrip_ids(meta: Mapping[str, Any], texts: Sequence[str], special: Sequence[int]) -> set:
    """Special tokens that strip the whitespace after them in a prompt (llama.cpp's
    LLAMA_TOKEN_ATTR_RSTRIP): a model whose general.name names Phi-3 gets it on every special
    token and </s>, except <unk>, <s> and <|endoftext|> (llama_vocab::load)."""
    name = str(meta.get("general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return set()
    named = ("</s>", "<unk>", "<s>", "<|endoftext|>")
    index = {t: i for i, t in enumerate(texts) if t in named}
    missing = [t for t in named if t not in index]
    if missing:  # llama.cpp fails to load such a vocab (token_to_id.at)
        raise BadModel(f"tokenizer: a Phi-3 vocabulary (general.name) without {missing}")
    return (set(special) | {index["</s>"]}) - {index[t] for t in named[1:]}


class Tokenizer:
    """Text <-> token ids, as llama.cpp does it for this GGUF's vocabulary."""

    def __init__(self, meta: Mapping[str, Any]):
        model = meta.get("tokenizer.ggml.model")
        if model is None:
            raise BadModel("tokenizer: metadata key 'tokenizer.ggml.model' missing")
        if model not in ("gpt2", "llama"):
            raise Unsupported(
                f"tokenizer: unsupported tokenizer model {model!r} "
                "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)"
            )
        self.kind = "bpe" if model == "gpt2" else "spm"
        tokens = _meta_list(meta, "tokenizer.ggml.tokens")
        n = len(tokens)
        if n == 0:
            raise BadModel("tokenizer: 'tokenizer.ggml.tokens' is empty")
        types = _meta_list(meta, "tokenizer.ggml.token_type", required=False)
        if types is not None and len(types) != n:
            raise BadModel(f"tokenizer: {len(types)} token types for {n} tokens")
        # set(map(type, ...)): one C pass, not 262k isinstance calls in a generator
        if types is not None and not set(map(type, types)) <= {int, bool}:
            raise BadModel("tokenizer: 'tokenizer.ggml.token_type' holds non-integers")
        types = list(types) if types is not None else [T_NORMAL] * n
        if not set(map(type, tokens)) <= {str}:
            raise BadModel("tokenizer: 'tokenizer.ggml.tokens' holds non-strings")
        # llama.cpp: an empty token text is renamed so that it can never match (all(): one C
        # pass; the per-token comprehension only for the rare vocab that has one)
        texts = (
            tokens if all(tokens) else [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        )
        self.texts, self.types = texts, types
        self.n_vocab = n
        self.token_to_id = dict(zip(texts, range(n)))  # zip in C: 2x a dict comprehension
        if len(self.token_to_id) != n:
            # llama.cpp keeps the last id of a duplicated text; but a converter never writes
            # one (unused ids get unique [PAD<i>] texts), so a duplicate means the text of some
            # id was lost: a damaged vocab, whose byte-level tokens may be gone (every prompt
            # then encodes to nothing). Refused, naming it.
            first: dict[str, int] = {}
            for i, t in enumerate(texts):
                if t in first:
                    raise BadModel(
                        f"tokenizer: token {ascii(t)[:80]} appears twice in "
                        f"'tokenizer.ggml.tokens' (ids {first[t]} and {i}): a "
                        "damaged vocabulary"
                    )
                first[t] = i
        # the texts forced to CONTROL, found by lookup (texts are unique), not a 262k scan
        eog_text_ids = sorted(i for i in map(self.token_to_id.get, _EOG_TEXTS) if i is not None)
        for i in eog_text_ids:
            types[i] = T_CONTROL

        if self.kind == "bpe":
            pre_name = meta.get("tokenizer.ggml.pre") or "default"
            if not isinstance(pre_name, str):
                raise BadModel(f"tokenizer: 'tokenizer.ggml.pre' = {pre_name!r} is not a string")
            pre = _PRE.get(pre_name)
            if pre is None:
                raise Unsupported(
                    f"tokenizer: unsupported pre-tokenizer {pre_name!r} "
                    f"(supported: {', '.join(sorted(_PRE))})"
                )
            self.pre_name, self.pre = pre_name, pre
            self.add_space_prefix = False
            default_bos, default_eos = 11, 11
            default_add_bos = pre.add_bos
            self.clean_spaces = pre.clean_spaces
        else:
            self.pre_name, self.pre = "spm", None
            self.add_space_prefix = True
            default_bos, default_eos = 1, 2
            default_add_bos = True
            self.clean_spaces = False
        self.add_space_prefix = _meta_bool(
            meta, "tokenizer.ggml.add_space_prefix", self.add_space_prefix
        )
        self.bos_id = _meta_id(meta, "tokenizer.ggml.bos_token_id", default_bos, n)
        self.eos_id = _meta_id(meta, "tokenizer.ggml.eos_token_id", default_eos, n)
        self.add_bos = _meta_bool(meta, "tokenizer.ggml.add_bos_token", default_add_bos)
        self.add_eos = _meta_bool(meta, "tokenizer.ggml.add_eos_token", False)
        # end-of-generation ids (llama.cpp's special_eog_ids): EOS, EOT, EOM and the texts
        # it forces to CONTROL; chat decoding stops at any of them
        eog = {
            self.eos_id,
            _meta_id(meta, "tokenizer.ggml.eot_token_id", None, n),
            _meta_id(meta, "tokenizer.ggml.eom_token_id", None, n),
        }
        eog.update(eog_text_ids)
        self.eog_ids = frozenset(i for i in eog if i is not None)

        # special tokens cut out of the text before the model: longest first (llama.cpp sorts
        # cache_special_tokens by text length, descending)
        special = list(compress(range(n), map(_SPECIAL_TYPES.__contains__, types)))
        special.sort(key=lambda i: -len(texts[i].encode("utf-8", "surrogatepass")))
        self._special_all = [(texts[i], i) for i in special]
        self._special_user = [(texts[i], i) for i in special if types[i] == T_USER_DEFINED]
        self._rstrip = _rstrip_ids(meta, texts, special)

        # the Rust tokenizer aborts the process when an allocation fails: refuse before it
        from minfer.host.hostmem import require

        merges = meta.get("tokenizer.ggml.merges")
        n_merges = len(merges) if isinstance(merges, (list, tuple)) else 0
        require(BUILD_BYTES_PER_ENTRY * (n + n_merges), "building the tokenizer")
        self._hf = self._build_bpe(meta) if self.kind == "bpe" else self._build_spm(meta)
        self._hf_lock = threading.Lock()
        self._pieces: dict[bool, list[bytes]] = {}

    # -- building the HF model ------------------------------------------------------------
    def _build_bpe(self, meta: Mapping[str, Any]):
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        merges_raw = _meta_list(meta, "tokenizer.ggml.merges")
        vocab = self.token_to_id
        merges = []
        for m in merges_raw:
            if not isinstance(m, str):
                raise BadModel(f"tokenizer: merge {m!r} is not a string")
            pos = m.find(" ", 1)  # llama.cpp: the first space after the first character
            if pos < 0:
                continue
            a, b = m[:pos], m[pos + 1 :]
            # HF refuses merges whose parts or result are no token; llama.cpp would merge and
            # then fall back to bytes. No real vocab has them: dropped.
            if a in vocab and b in vocab and a + b in vocab:
                merges.append((a, b))
        # A byte whose character is no token stays a symbol in llama.cpp's merge loop (it
        # blocks merges across it) and is dropped at the end; HF would drop it up front and
        # merge its neighbours. Placeholder ids past the vocab keep it, encode() drops them.
        hf_vocab = dict(vocab)
        for ch in _BYTE_DECODER:
            if ch not in hf_vocab:
                hf_vocab[ch] = self.n_vocab + len(hf_vocab) - len(vocab)
        try:
            bpe = models.BPE(vocab=hf_vocab, merges=merges, ignore_merges=self.pre.ignore_merges)
        except Exception as e:
            raise BadModel(f"tokenizer: cannot build the BPE model ({e})") from None
        tok = HFTokenizer(bpe)
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in self.pre.regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
        return tok

    def _build_spm(self, meta: Mapping[str, Any]):
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import models

        scores = _meta_list(meta, "tokenizer.ggml.scores", required=False)
        n = self.n_vocab
        if scores is not None and len(scores) != n:
            raise BadModel(f"tokenizer: {len(scores)} scores for {n} tokens")
        if scores is not None and not set(map(type, scores)) <= {int, float, bool}:
            raise BadModel("tokenizer: 'tokenizer.ggml.scores' holds non-numbers")
        scores = [float(s) for s in scores] if scores is not None else [0.0] * n
        vocab = self.token_to_id
        texts = self.texts
        ids = _spm_merge_ids(texts, vocab, scores)  # int32 [m, 2]: (left, right) token ids
        # the (left, right) text pairs: the texts as a numpy object array indexed by the id
        # columns (references copied in C), zipped into the tuples HF takes: ~2x faster
        # than mapping texts.__getitem__ over the columns' lists, ~10x ids.tolist()'s
        import numpy as np

        by_id = np.empty(n, object)
        by_id[:] = texts
        merges = list(zip(by_id[ids[:, 0]], by_id[ids[:, 1]]))
        del by_id
        self._has_byte_tokens = all(f"<0x{b:02X}>" in vocab for b in range(256))
        unk = self.texts[_meta_id(meta, "tokenizer.ggml.unknown_token_id", 0, n)]
        try:
            bpe = models.BPE(
                vocab=vocab, merges=merges, byte_fallback=True, unk_token=unk, fuse_unk=False
            )
        except Exception as e:
            raise BadModel(f"tokenizer: cannot build the SPM model ({e})") from None
        return HFTokenizer(bpe)

    # -- encode ---------------------------------------------------------------------------
    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """llama.cpp tokenizer_st_partition: raw text fragments (str) and special ids (int)."""
        frags: list[str | int] = [text]
        for tok_text, tid in self._special_all if parse_special else self._special_user:
            if not any(isinstance(f, str) and tok_text in f for f in frags):
                continue
            out: list[str | int] = []
            for f in frags:
                if isinstance(f, int) or tok_text not in f:
                    out.append(f)
                    continue
                parts = f.split(tok_text)
                for j, p in enumerate(parts):
                    if j:
                        out.append(tid)
                        if tid in self._rstrip:  # the token eats the whitespace after it
                            p = p.lstrip(_C_SPACE)
                    if p:
                        out.append(p)
            frags = out
        return frags

    def _encode_text(self, text: str, first: bool) -> list[int]:
        if self.kind == "spm":
            if self.add_space_prefix and first:
                text = " " + text
            text = text.replace(" ", "\u2581")
        with self._hf_lock:  # HF tokenizers objects are shared; keep calls serialized
            ids = self._hf.encode(text, add_special_tokens=False).ids
        n = self.n_vocab
        return ids if all(i < n for i in ids) else [i for i in ids if i < n]

    def encode(
        self,
        text: str,
        add_bos: bool | None = None,
        parse_special: bool = False,
        add_eos: bool | None = None,
    ) -> list[int]:
        """Token ids of `text` (llama_tokenize). add_bos/add_eos None: as the metadata says."""
        if not isinstance(text, str):
            raise BadInput(f"prompt must be text, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise BadInput(
                f"prompt is not valid Unicode ({e.reason} at character {e.start})"
            ) from None
        add_bos = self.add_bos if add_bos is None else add_bos
        add_eos = self.add_eos if add_eos is None else add_eos
        ids: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise BadModel("tokenizer: BOS requested but the vocab has no BOS token")
            ids.append(self.bos_id)
        prev_special = True  # SPM: a space prefix goes before text that starts or follows one
        if text:
            for f in self._partition(text, parse_special):
                if isinstance(f, int):
                    ids.append(f)
                    prev_special = True
                else:
                    ids.extend(self._encode_text(f, prev_special))
                    prev_special = False
        if add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    # -- decode ---------------------------------------------------------------------------
    def _piece(self, i: int, special: bool) -> bytes:
        """llama.cpp token_to_piece(token, lstrip=0, special)."""
        t, ty = self.texts[i], self.types[i]
        if ty in (T_CONTROL, T_UNKNOWN):
            return t.encode("utf-8", "surrogatepass") if special else b""
        if ty == T_USER_DEFINED:
            return t.encode("utf-8", "surrogatepass")
        if self.kind == "bpe":
            if ty != T_NORMAL:
                return b""
            out = bytearray()
            for ch in t:  # llama_decode_text
                b = _BYTE_DECODER.get(ch)
                if b is not None:
                    out.append(b)
                else:
                    u = ch.encode("utf-8", "surrogatepass")
                    out += b"[UNK_BYTE_0x" + u.hex().encode() + t.encode("utf-8", "surrogatepass")
                    out += b"]"
            return bytes(out)
        if ty == T_NORMAL:
            return t.replace("\u2581", " ").encode("utf-8", "surrogatepass")
        if ty == T_BYTE:
            try:
                return bytes([int(t[3:5], 16)])
            except ValueError:
                return b""
        return b""

    def _piece_table(self, special: bool) -> list[bytes]:
        tab = self._pieces.get(special)
        if tab is None:
            tab = [self._piece(i, special) for i in range(self.n_vocab)]
            self._pieces[special] = tab
        return tab

    def token_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        """The raw bytes llama_detokenize writes for ids (a piece may be half a character)."""
        tab = self._piece_table(special)
        if type(ids) is not list:  # (a list's items index as they are: ints, numpy ints)
            ids = [int(i) for i in ids]
        if ids and not (0 <= min(ids) and max(ids) < self.n_vocab):
            i = next(i for i in ids if not 0 <= i < self.n_vocab)
            raise BadInput(f"token id {i} out of range (vocab has {self.n_vocab} tokens)")
        out = [tab[i] for i in ids]
        if out and self.add_space_prefix and out[0][:1] == b" ":  # lstrip=1 on the first token
            out[0] = out[0][1:]
        data = b"".join(out)
        return _clean_spaces(data) if self.clean_spaces else data

    def decode(self, ids: Sequence[int] | Iterable[int], special: bool = False) -> str:
        """llama_detokenize(ids, remove_special=False, unparse_special=special) as text
        (invalid UTF-8, e.g. a cut multi-byte character, becomes U+FFFD)."""
        return self.token_bytes(ids, special).decode("utf-8", errors="replace")

    def piece(self, i: int) -> str:
        """One token's text as it reads inside a decoded sequence (a leading space kept, a
        special token's name shown, a cut multi-byte character as U+FFFD): top log-probs."""
        return self._piece_table(True)[int(i)].decode("utf-8", errors="replace")

    def token_text(self, i: int) -> str:
        return self.texts[i]

    # -- construction with a cache ----------------------------------------------------------
    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """Build (or reuse) the tokenizer of a GGUF metadata mapping.

        Cached per metadata object: the GGUF metadata of a loaded model is not mutated, and
        building from 49k tokens + 49k merges costs a few hundred ms.
        """
        key = id(meta)
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None and hit[0] is meta:
                return hit[1]
        tok = cls(meta)
        with _CACHE_LOCK:
            _CACHE[key] = (meta, tok)
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.pop(next(iter(_CACHE)))
        return tok


# vocabularies from this size on keep their SPM merge list in MINFER_CACHE (Gemma 3's 262k
# tokens take ~1.5 s of Python to derive it, the cached ids ~0.05 s to read)
SPM_CACHE_MIN_VOCAB = 1 << 16
_SPM_CACHE_TAG = b"minfer-spm-merges-1\0"


def _spm_merge_ids(texts: list[str], vocab: dict[str, int], scores: list[float]):
    """int32 [m, 2]: the (left, right) token ids of every way to make a
    token from two tokens, ranked by the merged token's score, highest first (llama.cpp's
    work queue pops the best-scoring bigram); ties by the merged id, then the split point.
    Read from / written to MINFER_CACHE for a large vocabulary, keyed by its hash."""
    import numpy as np

    path = _spm_cache_path(texts, scores) if len(texts) >= SPM_CACHE_MIN_VOCAB else None
    if path is not None:
        got = _read_merge_ids(path, len(texts))
        if got is not None:
            return got
    get = vocab.get
    cand = []
    for t, i in vocab.items():
        n = len(t)
        if n < 2:
            continue
        s = -scores[i]
        for k in range(1, n):
            a = get(t[:k])
            if a is not None:
                b = get(t[k:])
                if b is not None:
                    cand.append((s, i, k, a, b))
    cand.sort()  # (score, merged id, split) are unique: the ids never decide
    ids = np.array([(c[3], c[4]) for c in cand], np.int32).reshape(-1, 2)
    if path is not None:
        _write_merge_ids(path, ids)
    return ids


def _spm_cache_path(texts: list[str], scores: list[float]):
    """$MINFER_CACHE/tokenizer/spm-<sha256 of the tokens and scores>.npy."""
    import hashlib

    import numpy as np

    h = hashlib.sha256(_SPM_CACHE_TAG)
    h.update("\0".join(texts).encode("utf-8", "surrogatepass"))
    h.update(np.asarray(scores, "<f8").tobytes())
    from minfer.host.fileio import cache_root

    return cache_root("tokenizer") / f"spm-{h.hexdigest()[:32]}.npy"


def _read_merge_ids(path, n_vocab: int):
    """The cached int32 [m, 2] ids, or None when absent or not a sound file (rebuilt then)."""
    import numpy as np

    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError):
        return None
    if (
        a.dtype != np.int32
        or a.ndim != 2
        or a.shape[1] != 2
        or (a.size and (a.min() < 0 or a.max() >= n_vocab))
    ):
        return None
    return a


def _write_merge_ids(path, ids) -> None:
    """Best effort, atomically (a temporary name renamed): a cache that cannot be written
    (read-only home, full disk) only costs the next run the build again."""
    import os

    import numpy as np

    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            np.save(f, ids)
        os.replace(tmp, path)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


# every clean_spaces pass changes only a space before one of these (a scored prompt's text
# mostly has none: the passes' byte loop is then skipped)
_CLEAN_TRIGGERS = (b" ?", b" !", b" .", b" ,", b" '")


def _clean_spaces(data: bytes) -> bytes:
    """llama_detokenize's clean_spaces (bytes in, bytes out)."""
    if not any(x in data for x in _CLEAN_TRIGGERS):
        return data
    return _clean_spaces_passes(data)


def _clean_spaces_passes(data: bytes) -> bytes:
    """llama_detokenize's clean_spaces passes, ported index for index."""
    t = bytearray(data)
    total = len(t)
    # pass 1: " ?", " !", " .", " ," lose the space
    n1, total = total, (1 if total else 0)
    for i in range(1, n1):
        x = t[i]
        if t[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        t[total] = x
        total += 1
    # pass 2: a single apostrophe between spaces loses both spaces
    n2, total = total, (1 if total else 0)
    i = 1
    while i < n2:
        x = t[i]
        if x == 0x27 and i + 1 < n2 and t[i - 1] == 0x20 and t[i + 1] == 0x20:
            total -= 1
            i += 1
            t[i] = 0
        t[total] = x
        total += 1
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" lose the space
    n3, total = total, (1 if total else 0)
    for i in range(1, n3):
        x = t[i]
        if t[i - 1] == 0x20 and x == 0x27 and i + 1 < n3:
            x1 = t[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < n3:
                x2 = t[i + 2]
                if (x1, x2) in ((0x72, 0x65), (0x76, 0x65)):  # 're, 've
                    total -= 1
        t[total] = x
        total += 1
    return bytes(t[:total])


_CACHE: dict[int, tuple[Mapping[str, Any], Tokenizer]] = {}
_CACHE_SIZE = 4
_CACHE_LOCK = threading.Lock()
