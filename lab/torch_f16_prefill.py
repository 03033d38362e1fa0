"""Comparison only (device machine; torch is never a minfer dependency): a plain torch f16
llama forward (cuBLAS GEMMs + scaled_dot_product_attention, eager) at a given shape, pp tok/s.

python3 lab/torch_f16_prefill.py --tokens 512,2048 [--layers 32 --d 4096 --ff 14336
    --heads 32 --kv 8 --vocab 49152]
"""

import argparse
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--tokens", default="512,2048")
ap.add_argument("--layers", type=int, default=32)
ap.add_argument("--d", type=int, default=4096)
ap.add_argument("--ff", type=int, default=14336)
ap.add_argument("--heads", type=int, default=32)
ap.add_argument("--kv", type=int, default=8)
ap.add_argument("--vocab", type=int, default=49152)
ap.add_argument("--repeats", type=int, default=5)
a = ap.parse_args()
dev, dt = "cuda", torch.float16
D, hd = a.d, a.d // a.heads
g = torch.Generator(device=dev).manual_seed(0)


def w(n, k):
    return torch.randn(n, k, device=dev, dtype=dt, generator=g) / k**0.5


layers = [
    dict(
        q=w(a.heads * hd, D),
        k=w(a.kv * hd, D),
        v=w(a.kv * hd, D),
        o=w(D, a.heads * hd),
        g=w(a.ff, D),
        u=w(a.ff, D),
        d=w(D, a.ff),
        n1=torch.ones(D, device=dev, dtype=dt),
        n2=torch.ones(D, device=dev, dtype=dt),
    )
    for _ in range(a.layers)
]
emb = w(a.vocab, D)
head = w(a.vocab, D)


def rms(x, wt):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(dt) * wt


def rope(x, cos, sin):  # x [1, H, T, hd], neox-style halves (cost is the same as adjacent pairs)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


@torch.no_grad()
def forward(ids):
    T = ids.shape[0]
    pos = torch.arange(T, device=dev, dtype=torch.float32)
    inv = 500000.0 ** (-torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
    ang = pos[:, None] * inv[None]
    cos, sin = ang.cos().to(dt), ang.sin().to(dt)
    x = emb[ids]
    for L in layers:
        h = rms(x, L["n1"])
        q = (h @ L["q"].T).view(T, a.heads, hd).transpose(0, 1)[None]
        k = (h @ L["k"].T).view(T, a.kv, hd).transpose(0, 1)[None]
        v = (h @ L["v"].T).view(T, a.kv, hd).transpose(0, 1)[None]
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + o[0].transpose(0, 1).reshape(T, -1) @ L["o"].T
        h = rms(x, L["n2"])
        x = x + (F.silu(h @ L["g"].T) * (h @ L["u"].T)) @ L["d"].T
    return rms(x[-1:], layers[0]["n1"]) @ head.T


for n in [int(t) for t in a.tokens.split(",")]:
    ids = torch.randint(0, a.vocab, (n,), device=dev, generator=g)
    for _ in range(2):
        forward(ids)
    torch.cuda.synchronize()
    ts = []
    for _ in range(a.repeats):
        t0 = time.perf_counter()
        forward(ids)
        torch.cuda.synchronize()
        ts.append(n / (time.perf_counter() - t0))
    ts.sort()
    print(
        f"| torch f16 (cuBLAS + SDPA, eager) | {n} | {ts[len(ts) // 2]:,.1f} | "
        f"{(ts[-1] - ts[0]) / 2:,.1f} |"
    )
