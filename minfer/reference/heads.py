"""Label logits from final hidden states (issue 52): score, classification and rerank read the
logits of a few token ids at a row, never the row's [vocab] logits.

packed(..., hidden=rows) hands out the rows' hidden states after the output norm (f32
[m, d_model], both backends); LabelHead turns them into logits of L label rows of a weight
(the LM head's, or a reranker's cls.output): hidden @ W[labels].T, then gemma's soft cap, in
f32 on the host. d_model x L multiply-adds a row (L is a handful): no GPU kernel is worth it,
and the rows of W are dequantized once by the reference dequantizer, so the numbers are the
reference's full LM head at those ids (the GPU's own head rounds its operand to f16).
"""

from __future__ import annotations

import numpy as np

from minfer.errors import BadInput


class LabelHead:
    """model: a loaded GGUF model; labels int [L] rows of `weight` (default the LM head,
    model.output_name: token ids). __call__(hidden f32 [m, d_model]) -> f32 [m, L] logits."""

    def __init__(self, model, labels, weight: str | None = None):
        weight = weight or model.output_name
        n = int(model.tensor(weight).shape[0])
        lab = np.asarray(labels)
        if lab.ndim != 1 or lab.size == 0 or lab.dtype.kind not in "iu":
            raise BadInput(f"label ids must be a non-empty list of integers, got {lab.shape}")
        lab = lab.astype(np.int64)
        if lab.min() < 0 or lab.max() >= n:
            raise BadInput(
                f"label id {int(lab.max() if lab.max() >= n else lab.min())} out of range [0, {n})"
            )
        self.labels = lab
        self.w = model.dequant(weight, rows=lab).astype(np.float32)  # [L, d_model]
        self.cap = float(model.config.logit_softcap or 0.0)

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        logits = np.asarray(hidden, np.float32) @ self.w.T  # [m, L]
        if self.cap:  # as ReferenceBackend._head: scale by 1/cap, tanh, scale by cap
            cap = np.float32(self.cap)
            t = (logits * (np.float32(1.0) / cap)).astype(np.float64)
            logits = np.tanh(t).astype(np.float32) * cap
        return logits.astype(np.float32)
