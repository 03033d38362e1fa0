"""Test models for the pooled jobs (issue 52): the tiny qwen3 preset (F16, a generated vocab of
1024) rewritten with the keys llama.cpp's converter writes for Qwen3-Embedding / -Reranker:
`qwen3.pooling_type` (uint32: 1 mean, 2 cls, 3 last, 4 rank) and, for a reranker,
`tokenizer.chat_template.rerank`; the vocab's last three pair tokens become "ye", "yes", "no"
(merges "y e", "ye s", "n o") so the rerank labels are single tokens, as in Qwen's vocab."""

from __future__ import annotations

from pathlib import Path


def qwen3_pooling_model(
    folder: Path, pooling: int | None = 3, rerank: str | None = None, name: str = "qwen3-pool.gguf"
) -> Path:
    import gguf
    from families_data import synth_family

    from minfer.gguf.write import metadata_from_reader, write_gguf

    folder = Path(folder)
    src = folder / "tiny-qwen3.gguf"
    if not src.exists():
        synth_family("tiny-qwen3", folder)
    r = gguf.GGUFReader(src)
    meta = metadata_from_reader(r)
    V = gguf.GGUFValueType
    toks = list(meta["tokenizer.ggml.tokens"].value)
    merges = list(meta["tokenizer.ggml.merges"].value)
    n_pairs = len(merges)
    for k, (tok, merge) in enumerate((("ye", "y e"), ("yes", "ye s"), ("no", "n o"))):
        toks[256 + n_pairs - 3 + k] = tok
        merges[n_pairs - 3 + k] = merge
    meta["tokenizer.ggml.tokens"] = gguf.GGUFValue(toks, V.ARRAY, V.STRING)
    meta["tokenizer.ggml.merges"] = gguf.GGUFValue(merges, V.ARRAY, V.STRING)
    if pooling is not None:  # gguf_writer.add_pooling_type: add_uint32
        meta["qwen3.pooling_type"] = gguf.GGUFValue(pooling, V.UINT32)
    if rerank is not None:  # add_chat_template([{"name": "rerank", ...}])
        meta["tokenizer.chat_template.rerank"] = gguf.GGUFValue(rerank, V.STRING)
    tensors = [
        (t.name, int(t.tensor_type), tuple(int(x) for x in reversed(t.shape)), t.data)
        for t in r.tensors
    ]
    return write_gguf(folder / name, "qwen3", meta, tensors, progress=False)
