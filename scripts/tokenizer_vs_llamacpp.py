"""Compare minfer.tokenizer with llama.cpp itself (through llama-cpp-python) on random text.

Not part of the suite (CI has no llama.cpp): a developer's verification tool. Needs
llama-cpp-python importable (e.g. `pip install llama-cpp-python==0.3.36`, the golden files'
version, a CPU build). Checks, for each vocab:
  * llama_tokenize(text, add_special, parse_special) == Tokenizer.encode(...) for both flags,
  * llama_detokenize(ids, remove_special=False, unparse_special) == Tokenizer.token_bytes(...),
on N random strings (ASCII-heavy mixes of many scripts, digits, whitespace kinds, specials).

Vocabs: the real SmolLM2 model (pre `smollm`), byte-level BPE vocabs trained here with HF
tokenizers and written as GGUF with each supported pre-tokenizer name, and a synthetic
SentencePiece vocab (`llama` model: scores, byte tokens, control tokens).

    python scripts/tokenizer_vs_llamacpp.py [--n 2000] [--model models/SmolLM2-...gguf]
"""

from __future__ import annotations

import argparse
import ctypes
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PIECES = ["the", " the", "The", "don't", "it's", "we'll", " 're", "'S", "'LL", "hello",
          " world", "12345", "3.14159", "1,000,000", "x=42;", "  ", "   ", "\n", "\n\n", "\r\n",
          "\t", " \n ", "🙂", "👍🏽", "世界", "日本語", "한국어", "Привет", "مرحبا", "١٢٣",
          "²³", "Ⅻ", "e\u0301", "\u00a0", "\u2003", "\u3000", "\u200b", "\ufeff", "...", "!?",
          "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<unk>", "<|user|>",
          "$100", "a+b=c", "~^|<>", "`code`", "naïve", "ß", "ﬁ", "\x00", "\x7f", "#!", "@@",
          "-->", "«»", "—", "…", "’s", "ʼ"]


def random_text(rng: random.Random) -> str:
    out = []
    for _ in range(rng.randint(0, 12)):
        r = rng.random()
        if r < 0.55:
            out.append(rng.choice(PIECES))
        elif r < 0.8:
            out.append("".join(rng.choice("abcdefghij XYZ0123456789.,'\n-") for _ in
                               range(rng.randint(1, 8))))
        else:
            lo, hi = rng.choice([(0x20, 0x7e), (0xa0, 0x24f), (0x370, 0x52f), (0x4e00, 0x4fff),
                                 (0x1f300, 0x1f64f), (0x2000, 0x206f), (0x0, 0x1f),
                                 (0x10000, 0x10ffff)])
            s = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4)))
            out.append(s.encode("utf-8", "replace").decode("utf-8", "replace"))
    return "".join(out).encode("utf-8", "replace").decode("utf-8")


class LlamaVocab:
    def __init__(self, path: Path):
        from llama_cpp import Llama

        self.llm = Llama(str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        import llama_cpp

        n = len(text) * 2 + 16
        buf = (llama_cpp.llama_token * n)()
        k = llama_cpp.llama_tokenize(self.vocab, text, len(text), buf, n, add_special,
                                     parse_special)
        assert k >= 0, k
        return list(buf[:k])

    def detokenize(self, ids: list[int], special: bool) -> bytes:
        import llama_cpp

        arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
        n = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(n)
        k = llama_cpp.llama_detokenize(self.vocab, arr, len(ids), buf, n, False, special)
        assert k >= 0, k
        return buf.raw[:k]


def compare(name: str, gguf_path: Path, n: int, seed: int = 0) -> int:
    from minfer.loader import GGUFModel
    from minfer.tokenizer import Tokenizer

    import gguf

    meta = {k: f.contents() for k, f in gguf.GGUFReader(str(gguf_path)).fields.items()}
    ours = Tokenizer(meta)
    ll = LlamaVocab(gguf_path)
    rng = random.Random(seed)
    bad = 0
    for i in range(n):
        s = random_text(rng)
        b = s.encode()
        for add_special in (False, True):
            for ps in (False, True):
                want = ll.tokenize(b, add_special, ps)
                got = ours.encode(s, add_bos=None if add_special else False, parse_special=ps,
                                  add_eos=None if add_special else False)
                if got != want:
                    bad += 1
                    if bad <= 8:
                        print(f"  [{name}] encode mismatch add_special={add_special} "
                              f"parse_special={ps} {s!r}\n    llama.cpp {want}\n    minfer    {got}")
                for sp in (False, True):
                    w = ll.detokenize(want, sp)
                    g = ours.token_bytes(want, special=sp)
                    if w != g:
                        bad += 1
                        if bad <= 8:
                            print(f"  [{name}] decode mismatch special={sp} {want}\n"
                                  f"    llama.cpp {w!r}\n    minfer    {g!r}")
    print(f"{name}: {n} strings x 4 encode modes x 2 decode modes, {bad} mismatches")
    del GGUFModel
    return bad


def _hparams(w) -> None:
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)


def trained_bpe_gguf(path: Path, pre: str, corpus: list[str]) -> Path:
    import json

    import gguf
    from tokenizers import Tokenizer as HF, models, pre_tokenizers, trainers

    hf = HF(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|user|>"]
    tr = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials, show_progress=False,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(corpus, tr)
    js = json.loads(hf.to_str())
    vocab = js["model"]["vocab"]
    merges = [" ".join(m) if isinstance(m, list) else m for m in js["model"]["merges"]]
    toks = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    types = [3 if t in specials[:3] else 4 if t == "<|user|>" else 1 for t in toks]
    w = gguf.GGUFWriter(str(path), "llama")
    _hparams(w)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(toks.index("<|im_start|>"))
    w.add_eos_token_id(toks.index("<|im_end|>"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def spm_gguf(path: Path, seed: int = 0) -> Path:
    import gguf

    rng = random.Random(seed)
    alpha = "abcdeéi ▁xyz"
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = [c for c in alpha if c != " "]
    while len(pieces) < 400:
        wd = "".join(rng.choice(alpha.replace(" ", "")) for _ in range(rng.randint(2, 6)))
        if wd not in pieces:
            pieces.append(wd)
    scores = [0.0] * len(tokens) + [-float(s) for s in rng.sample(range(1, 5000), len(pieces))]
    tokens += pieces
    types += [1] * len(pieces)
    w = gguf.GGUFWriter(str(path), "llama")
    _hparams(w)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1500)
    ap.add_argument("--model", default=str(REPO / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    bad = 0
    if Path(a.model).exists():
        bad += compare("smollm2 (real)", Path(a.model), a.n)
    rng = random.Random(1)
    corpus = []
    for p in sorted(Path(random.__file__).parent.glob("*.py"))[:60]:
        corpus.append(p.read_text(errors="replace"))
    corpus += [random_text(rng) for _ in range(3000)]
    with tempfile.TemporaryDirectory() as d:
        for pre in ["gpt-2", "default", "starcoder", "smollm", "llama-bpe", "qwen2", "falcon",
                    "command-r", "refact", "stablelm2", "dbrx"]:
            bad += compare(f"trained BPE, pre={pre}",
                           trained_bpe_gguf(Path(d) / f"{pre}.gguf", pre, corpus), a.n // 3)
        bad += compare("synthetic SPM", spm_gguf(Path(d) / "spm.gguf"), a.n)
    print("TOTAL mismatches:", bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
