"""The prefill-only jobs' prompts and numbers (issue 52): embeddings, score, rerank.

Pooling: llama.cpp's `<arch>.pooling_type` key (uint32, src/llama-arch.cpp; the converter writes
it from a sentence-transformers Pooling module): 0 none, 1 mean, 2 cls, 3 last, 4 rank. minfer
always pools: 1, 2, 3 as named, 4 (a reranker) and 0 / no key as `last` (a causal model's last
token is the only one that read the whole prompt: Qwen3-Embedding's pooling); --pooling (or
pooling=) overrides. An embedding is the pooled final-normed hidden state, cut to `dimensions`
(Matryoshka) and then L2-normalised (by default).

Score (SGLang's /v1/score): each item's prompt is query + item (item + query with item_first;
text joined then tokenized, or token lists concatenated); the label tokens' logits at its last
row (the next token's) become probabilities: a softmax over the labels (apply_softmax), else
each label's full-vocabulary probability exp(logit - logsumexp).

Rerank: the prompt is a template with {query} and {document}: the GGUF's
`tokenizer.chat_template.rerank` (llama.cpp's converter writes Qwen3-Reranker's there), else
Qwen3-Reranker's documented prompt (QWEN3_RERANK below, the default instruction), or a file
(--rerank-template). relevance = softmax over the logits of "yes" and "no" at the last row,
the "yes" share (Qwen3-Reranker's model card; llama.cpp's rank pooling for qwen3 computes the
same from its cls.output rows [yes, no]). The query comes before the document, so every
document of a query starts with the same tokens: the prefix cache computes them once.
"""

from __future__ import annotations

import base64

import numpy as np

from minfer.errors import BadInput

POOLINGS = ("last", "mean", "cls")
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama_pooling_type

QWEN3_RERANK = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that "
    "answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


def model_pooling(model) -> tuple[str, str]:
    """(pooling, where it came from) for a loaded model: its pooling_type key, else `last`."""
    key = f"{model.config.arch}.pooling_type"
    v = model.metadata.get(key)
    if v is None:
        return "last", "default (no pooling_type key)"
    name = GGUF_POOLING.get(int(v)) if isinstance(v, (int, np.integer)) else None
    if name is None:
        raise BadInput(
            f"{key} = {v!r}: not a llama.cpp pooling type (0 none, 1 mean, 2 cls, 3 last, 4 rank)"
        )
    if name in ("none", "rank"):
        return "last", f"{key} = {int(v)} ({name}): pooled as last"
    return name, f"{key} = {int(v)} ({name})"


def check_pooling(p) -> str:
    if p not in POOLINGS:
        raise BadInput(f"pooling must be one of {', '.join(POOLINGS)}, not {p!r}")
    return p


def finish(vec: np.ndarray, dims: int | None = None, normalize: bool = True) -> np.ndarray:
    """A pooled f32 [d] vector cut to its first `dims` values, then L2-normalised."""
    v = np.asarray(vec, np.float64)[:dims]
    if normalize:
        n = float(np.linalg.norm(v))
        v = v / n if n > 0 else v
    return v.astype(np.float32)


def b64(vec: np.ndarray) -> str:
    """OpenAI's encoding_format base64: the little-endian float32 bytes, base64."""
    return base64.b64encode(np.asarray(vec, "<f4").tobytes()).decode("ascii")


def check_dims(dims, d_model: int) -> int | None:
    if dims is None:
        return None
    if (
        isinstance(dims, bool)
        or not isinstance(dims, (int, np.integer))
        or not 1 <= dims <= d_model
    ):
        raise BadInput(
            f"dimensions must be an integer in [1, {d_model}] (the model's "
            f"embedding size), got {dims!r}"
        )
    return int(dims)


def label_probs(logits: np.ndarray, lse: float | None, softmax: bool) -> list[float]:
    """Label logits f32 [L] -> probabilities: softmax over them, or exp(logit - lse)."""
    x = np.asarray(logits, np.float64)
    if softmax:
        e = np.exp(x - x.max())
        return (e / e.sum()).tolist()
    return np.exp(x - float(lse)).tolist()


def score_ids(tok, query, items, item_first: bool) -> list[list[int]]:
    """Each item's prompt ids: query + item (text joined then tokenized, or id lists joined)."""
    if isinstance(query, str) != all(isinstance(i, str) for i in items):
        raise BadInput("query and items must both be text or both be token id lists")
    if isinstance(query, str):
        return [
            tok.encode(i + query if item_first else query + i, parse_special=True, add_eos=False)
            for i in items
        ]
    q = list(query)
    return [list(i) + q if item_first else q + list(i) for i in items]


class Reranker:
    """The rerank prompt and its yes/no label ids for a model: template (text with {query} and
    {document}; None: the GGUF's rerank template, else QWEN3_RERANK)."""

    def __init__(self, model, tok, template: str | None = None):
        meta = model.metadata
        own = meta.get("tokenizer.chat_template.rerank")
        if template is not None:
            self.template, self.source = template, "--rerank-template"
        elif isinstance(own, str):
            self.template, self.source = own, "the GGUF's tokenizer.chat_template.rerank"
        else:
            self.template, self.source = QWEN3_RERANK, "Qwen3-Reranker's template (default)"
        for k in ("{query}", "{document}"):
            if k not in self.template:
                raise BadInput(f"the rerank template ({self.source}) has no {k}")
        if self.template.index("{query}") > self.template.index("{document}"):
            raise BadInput(
                f"the rerank template ({self.source}) must put {{query}} before "
                "{document} (the documents share the query's prefix)"
            )
        self.tok = tok
        self.labels = [self._one(tok, "yes"), self._one(tok, "no")]

    @staticmethod
    def _one(tok, word: str) -> int:
        ids = tok.encode(word, add_bos=False, add_eos=False)
        if len(ids) != 1:
            raise BadInput(
                f"rerank: {word!r} is {len(ids)} tokens in this vocabulary, not one "
                "(the relevance score reads its logit)"
            )
        return ids[0]

    def ids(self, query: str, doc: str) -> list[int]:
        text = self.template.replace("{query}", query).replace("{document}", doc)
        return self.tok.encode(text, parse_special=True, add_eos=False)

    @staticmethod
    def relevance(logits: np.ndarray) -> float:
        """P(yes) of softmax([yes, no]) = sigmoid(yes - no)."""
        return float(1.0 / (1.0 + np.exp(-(float(logits[0]) - float(logits[1])))))
