// attention_common.cuh: which keys a query token sees and how a score is shaped, shared by the
// three attention kernels (attention.cu, attention_sm90a.cu, attention_tok.cu). The per-layer
// options are a model's: `window` (sliding-window layers: gemma2/3's local layers, Mistral
// 7B v0.1; 0: none) and `cap_s` (gemma2's attention logit soft-capping; 0: none).
// Numpy twin: minfer.reference.ops.attention (window, softcap).
#pragma once

// (slot, first visible key) of query token t: tok's (slot, lo), or (pos0 + t, 0) for one
// sequence at host pos0. A window keeps the keys with slot - key < window (llama.cpp's
// is_masked_swa: p1 - p0 >= n_swa masks), so the first key rises to slot - window + 1. Both
// stay non-decreasing in t (slot and lo are), which the tile kernels' first tile (their first
// row's key) and mask skipping (their last row's) rely on.
__device__ __forceinline__ int2 tok_at(const int2* __restrict__ tok, int pos0, int t,
                                       int window) {
    int2 v = tok != nullptr ? tok[t] : make_int2(pos0 + t, 0);
    if (window > 0) v.y = max(v.y, v.x - window + 1);
    return v;
}

// Soft-capping of a raw score s = q.k: the kernels apply the softmax scale in the exponent
// (exp2(s * scale_log2)), so the launcher passes cap_s = cap / scale, and cap_s tanh(s / cap_s)
// = cap tanh(s scale / cap) / scale: gemma2's cap * tanh(scaled score / cap), unscaled again.
__device__ __forceinline__ float softcap(float s, float cap_s) {
    return cap_s * tanhf(s / cap_s);
}
