"""A CPU runtime that runs kernels/moe.cu's entries in numpy (tests only): device memory is a set
of numpy byte arrays addressed like device pointers, device arrays read and write them, the
weight upload's pinned copies land in them, and a launch of a moe.cu entry (or a dequant
entry) decodes its arguments in the order of the kernel's C signature and computes what the
kernel computes, walking the grid as the kernel does (the grouped GEMM's tile scheduler: every
row of offs[E] in exactly one (row tile, column tile), tiles past toff[E] idle). So the host
side of the MoE layer (launchers' argument packing, buffer views, the upload) runs without a GPU;
the kernels' own arithmetic is tests/gpu/test_moe_device.py's business."""

from __future__ import annotations

import bisect
import types

import numpy as np

from minfer.cuda.ops import moe as M
from minfer.reference import ops


class HeapRT:
    sm_count, smem_optin, arch = 132, 232448, "sm_90"
    poisoning = False
    stream = None

    def __init__(self):
        self.cfg = types.SimpleNamespace(debug=False, poison=False)
        self.bases: list[int] = []
        self.mem: dict[int, np.ndarray] = {}
        self._next = 1 << 20
        self.launches: list[str] = []
        self.covered = None  # the last grouped GEMM's count of writes per output element
        rt = self

        class _Stream:
            def synchronize(self):
                pass

        class _Event:
            def record(self, stream=None):
                pass

            def synchronize(self):
                pass

        self.drv = types.SimpleNamespace(
            pagelocked_empty=lambda shape, dtype: np.empty(shape, dtype),
            memcpy_htod_async=lambda dst, src, stream=None: rt.write(int(dst), src),
            Stream=_Stream,
            Event=_Event,
            Error=RuntimeError,
            memset_d8=lambda p, b, n: rt.bytes_at(int(p), int(n)).fill(b),
            Memcpy2D=lambda: _Memcpy2D(rt),
        )

    # -- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int, what: str = "buffer"):
        p = self._next
        self._next += (int(nbytes) + 255) // 256 * 256 + 256
        self.bases.append(p)
        self.mem[p] = np.zeros(max(int(nbytes), 1), np.uint8)

        class _Ptr(int):
            def free(self_) -> None:
                pass

        return _Ptr(p)

    def bytes_at(self, addr: int, n: int) -> np.ndarray:
        i = bisect.bisect_right(self.bases, addr) - 1
        base = self.bases[i]
        off = addr - base
        buf = self.mem[base]
        assert off + n <= buf.size, f"access past an allocation: {addr:#x}+{n}"
        return buf[off : off + n]

    def at(self, addr: int, shape, dtype) -> np.ndarray:
        """A writable view of device memory at addr."""
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        return self.bytes_at(int(addr), n).view(dt).reshape(shape)

    def write(self, addr: int, src) -> None:
        b = np.ascontiguousarray(src).reshape(-1).view(np.uint8)
        self.bytes_at(addr, b.size)[:] = b

    def mem_info(self):
        return 80 << 30, 80 << 30

    def synchronize(self):
        pass

    def poison(self, ptr, nbytes):
        pass

    def function(self, name, entry, options=(), dyn_smem=0):
        return (name, entry)

    # -- launches ------------------------------------------------------------------------------
    def launch(self, fn, grid, block, args, smem=0, stream=None):
        name, entry = fn
        self.launches.append(entry)
        a = [
            int(x) if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype, np.integer) else x
            for x in args
        ]
        if entry == "moe_route_f32":
            sel, wts, logits, T, E, k, norm_w, w_scale = a
            assert grid[0] * 4 >= T
            s, w = self.at(sel, (T, k), np.int32), self.at(wts, (T, k), np.float32)
            M.route_ref(s, w, self.at(logits, (T, E), np.float32), k, bool(norm_w), float(w_scale))
        elif entry == "moe_sort":
            offs, toff, perm, rowpos, sel, P, E, bm = a
            M.sort_ref(
                self.at(offs, (E + 1,), np.int32),
                self.at(toff, (E + 1,), np.int32),
                self.at(perm, (P,), np.int32),
                self.at(rowpos, (P,), np.int32),
                self.at(sel, (P,), np.int32),
                E,
                bm,
            )
        elif entry in ("moe_gemm_f16", "moe_gemm_f16_glu"):  # (Cf, Ch, ..., N = out width)
            glu = entry.endswith("_glu")
            Cf, Ch, A, a_rows, a_div, W, offs, toff, E, N, K = a
            self._gemm(
                glu,
                M.BN,
                grid,
                Ch if glu else Cf,
                A,
                a_rows,
                a_div,
                W,
                offs,
                toff,
                E,
                2 * N if glu else N,
                K,
            )
        elif entry in ("moe_mma_f16", "moe_mma_f16_glu"):  # (C, ..., N = W's rows)
            assert smem == M.MMA_SMEM
            self._gemm(entry.endswith("_glu"), M.MMA_BN, grid, *a)
        elif entry == "moe_combine_f32":
            x, ys, wts, rowpos, k, D = a
            T = grid[0]
            rp = self.at(rowpos, (T * k,), np.int32)
            P = int(rp.max()) + 1
            M.combine_ref(
                self.at(x, (T, D), np.float32),
                self.at(ys, (P, D), np.float32),
                self.at(wts, (T, k), np.float32),
                rp,
            )
        elif entry == "moe_shared_add_f32":  # qwen2moe: x += sigmoid(gl) * y, a block a row
            x, y, gl, D = a
            T = grid[0]
            M.shared_add_ref(
                self.at(x, (T, D), np.float32),
                self.at(y, (T, D), np.float32),
                self.at(gl, (T, 1), np.float32),
            )
        elif entry.startswith("dq_f16_"):
            src, src_bytes, out, n = a
            from minfer.cuda.ops.dequant import kernel_suffix
            from minfer.quants import TRAITS, dequantize

            t = next(t for t in TRAITS.values() if "dq_f16_" + kernel_suffix(t) == entry)
            raw = self.at(src, (int(src_bytes),), np.uint8)
            self.at(out, (int(n),), np.float16)[:] = dequantize(raw, t.qtype).reshape(-1)
        elif entry == "blk_operand_f16":  # a weight's requant, or a token operand (blk-split)
            x, ld, R, K, Rp, out, smul, pair = a
            from minfer.cuda.paths.blk.twin import blk_operand, blk_shape, quantize_blk

            weight = float(smul) == np.float32(1 / 128) and pair == 2
            assert ld == K and (weight or (float(smul) == 1.0 and pair == 1))
            w = self.at(x, (R, K), np.float16)
            self.at(out, blk_shape(R, K), np.uint8)[...] = blk_operand(
                *quantize_blk(w, weight=weight)
            )
        elif entry in ("mmq_blk", "mmq_blk_acc"):  # the dense blk GEMM (blk-split's route)
            self._blk_dense(entry.endswith("_acc"), block, smem, *a)
        elif entry in ("moe_blk_operand_f16", "moe_blk_operand_f16_tok"):
            self._blk_operand(entry.endswith("_tok"), grid, *a)
        elif entry in ("moe_blk", "moe_blk_tok_swiglu"):
            self._blk_gemm(entry == "moe_blk_tok_swiglu", grid, block, smem, *a)
        elif entry == "blk_split_cols":  # (blk-split's operands: kernels/blk_split.cu)
            from minfer.cuda.paths.blk.outliers import blk_split_cols_ref

            A, ld, M_, cols, n, out = a
            assert grid == (-(-M_ * n // 256),)
            c = self.at(cols, (n,), np.int32)
            blk_split_cols_ref(
                self._rows(A, ld, M_, int(c.max()) + 1), c, self.at(out, (M_, n), np.float16)
            )
        elif entry == "col_sumsq_f16":
            from minfer.cuda.paths.blk.outliers import col_sumsq_ref

            A, ld, M_, K, acc = a
            assert grid == (-(-K // 256),)
            col_sumsq_ref(self._rows(A, ld, M_, K), self.at(acc, (K,), np.float32))
        # any other kernel: not emulated (the MoE layer launches none)

    def _rows(self, A, ld: int, M: int, K: int) -> np.ndarray:
        """A writable f16 [M, K] view of rows `ld` elements apart at A (the last row's
        K elements the end of what is read)."""
        flat = self.at(A, (ld * (M - 1) + K,), np.float16)
        return np.lib.stride_tricks.as_strided(flat, (M, K), (2 * ld, 2))

    def _blk_operand(self, tok, grid, x, a_rows, a_div, offs, toff, E, K, MT, out):
        """moe_blk_operand_f16[_tok]: the twin on the heap's arrays (rows of x: the largest
        source row + 1)."""
        from minfer.cuda.paths.blk import moe as B
        from minfer.cuda.paths.blk.twin import kblocks

        o = self.at(offs, (E + 1,), np.int32)
        P = int(o[E])
        rows = self.at(a_rows, (P,), np.int32) if a_rows else None
        n_x = int(rows.max()) // a_div + 1 if a_rows else P
        quads = MT * B.BM * kblocks(K)
        assert grid == ((MT * B.BM // 8,) if tok else (-(-quads // 64),)), grid
        tt = self.at(out, (kblocks(K), MT, B.BLK_OP), np.uint8)
        B.operand_ref(
            tt,
            self.at(x, (n_x, K), np.float16),
            o,
            self.at(toff, (E + 1,), np.int32),
            rows,
            a_div,
            tok,
        )

    def _blk_dense(self, acc, block, smem, tt, wb, out, M, N, K, dp, ws, flags):
        """mmq_blk[_acc]: the kernel's math from its operands' bytes (twin.blk_gemm, float64)
        rounded once to f32 (the kernel folds in f32 per 128 of K: tests/gpu compares that)."""
        from minfer.cuda.paths.blk.launch import blk_smem
        from minfer.cuda.paths.blk.twin import blk_gemm, blk_shape, blk_unoperand

        assert block == (384,) and smem == blk_smem()
        qa, sa = blk_unoperand(self.at(tt, blk_shape(M, K), np.uint8), M)
        qw, sw = blk_unoperand(self.at(wb, blk_shape(N, K), np.uint8), N)
        y = blk_gemm(qa, sa, qw, sw).astype(np.float32)
        C = self.at(out, (M, N), np.float32)
        C[...] = C + y if acc else y

    def workspace(self, key: str, nbytes: int, split: int | None = None):
        """stream-K's partials and flags (unused by the emulated GEMM: a zeroed allocation)."""
        p = int(self.alloc(nbytes, key))
        return p if split is None else (np.uintp(p), np.uintp(p + int(split)))

    def _blk_gemm(self, glu, grid, block, smem, Tt, Wb, C, offs, toff, E, MT, N, K):
        from minfer.cuda.paths.blk import moe as B
        from minfer.cuda.paths.blk.launch import blk_smem
        from minfer.cuda.paths.blk.twin import kblocks, pad128

        assert block == (384,) and smem == blk_smem() and grid == (pad128(N) // 128, MT)
        o = self.at(offs, (E + 1,), np.int32)
        P = int(o[E])
        w = B.BlkExperts(self.at(Wb, B.experts_shape(E, N, K), np.uint8), E, N, K)
        out = self.at(C, (P, N // 2 if glu else N), np.float16 if glu else np.float32)
        tt = self.at(Tt, (kblocks(K), MT, B.BLK_OP), np.uint8)
        B.grouped_gemm_ref(out, tt, w, o, self.at(toff, (E + 1,), np.int32), glu)

    def _gemm(self, glu, bn, grid, C, A, a_rows, a_div, W, offs, toff, E, N, K):
        """A grouped GEMM's walk: W [E, N, K] (glu: N = 2F rows, interleaved per 16), the
        column tiles of bn output columns."""
        bm = M.BM
        o = self.at(offs, (E + 1,), np.int32)
        to = self.at(toff, (E + 1,), np.int32)
        P = int(o[E])
        No = N // 2 if glu else N
        cols = No if bn == M.BN else N  # the wmma kernel tiles output columns, mma W rows
        assert grid[0] == -(-cols // bn) and grid[1] >= to[E], (grid, to[E])
        w = self.at(W, (E, N, K), np.float16)
        if glu:  # de-interleave: feature f's gate row 16 (f // 8) + f % 8, its up row + 8
            f = np.arange(No)
            g_rows = (f // 8) * 16 + f % 8
            wg, wu = w[:, g_rows], w[:, g_rows + 8]
        C = self.at(C, (P, No), np.float16 if glu else np.float32)
        rows_idx = self.at(a_rows, (P,), np.int32) if a_rows else None
        n_a = int(rows_idx.max()) // a_div + 1 if a_rows else P
        Am = self.at(A, (n_a, K), np.float16)
        self.covered = np.zeros((P, No), np.int32)
        for mt in range(grid[1]):
            if mt >= to[E]:
                continue
            e = int(np.searchsorted(to, mt, side="right")) - 1  # toff[e] <= mt < toff[e + 1]
            r0 = int(o[e]) + (mt - int(to[e])) * bm
            r1 = min(r0 + bm, int(o[e + 1]))
            src = np.arange(r0, r1) if rows_idx is None else rows_idx[r0:r1] // a_div
            x = Am[src].astype(np.float32)
            for nt in range(grid[0]):
                c0, c1 = nt * bn, min(nt * bn + bn, cols)
                if glu:  # output columns c0 .. c1 (wmma) or those of W rows c0 .. c1 (mma)
                    c0, c1 = (c0, c1) if cols == No else (c0 // 2, c1 // 2)
                    g = x @ wg[e, c0:c1].astype(np.float32).T
                    u = x @ wu[e, c0:c1].astype(np.float32).T
                    C[r0:r1, c0:c1] = ops.swiglu(g, u).astype(np.float16)
                else:
                    C[r0:r1, c0:c1] = x @ w[e, c0:c1].astype(np.float32).T
                self.covered[r0:r1, c0:c1] += 1


class _Memcpy2D:
    """pycuda's Memcpy2D between device addresses (weights._copy_interleaved's use)."""

    def __init__(self, rt):
        self.rt = rt

    def set_src_device(self, p):
        self.src = int(p)

    def set_src_host(self, a):
        raise AssertionError("the MoE upload copies device to device")

    def set_dst_device(self, p):
        self.dst = int(p)

    def __call__(self, aligned_or_stream=True):
        for r in range(self.height):
            row = self.rt.bytes_at(self.src + r * self.src_pitch, self.width_in_bytes).copy()
            self.rt.write(self.dst + r * self.dst_pitch, row)


class HeapArray:
    """pycuda GPUArray's part the launchers and MoeLayers use, over HeapRT memory."""

    rt: HeapRT = None  # set by install

    def __init__(self, shape, dtype, gpudata=None, base=None, strides=None):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.gpudata, self.base = gpudata, base
        self.strides = strides or tuple(
            self.dtype.itemsize * int(np.prod(self.shape[i + 1 :])) for i in range(len(self.shape))
        )

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def get(self):
        return self.rt.at(int(self.gpudata), self.shape, self.dtype).copy()

    def set(self, a) -> None:
        self.rt.at(int(self.gpudata), self.shape, self.dtype)[...] = np.asarray(a).reshape(
            self.shape
        )


def install(monkeypatch) -> HeapRT:
    """A HeapRT, with devarray building HeapArrays over it and the f16 GEMM launcher (the
    router's; qwen2moe's shared expert's, its glu epilogue too) computing on it in numpy."""
    from minfer.cuda.paths.f16 import gemm
    from minfer.cuda.runtime import devarray

    rt = HeapRT()
    cls = type("HeapArrayOf", (HeapArray,), {"rt": rt})
    monkeypatch.setattr(devarray, "_ga", lambda: types.SimpleNamespace(GPUArray=cls))

    def gemm_f16_nt(a, b, out_dtype=np.float32, accumulate=None, *, out=None, rt=None, **kw):
        assert kw.get("rope") is None
        if accumulate is not None:  # (blk-split's kept columns, added into the f32 C)
            accumulate.set(gemm.gemm_f16_nt_ref(a.get(), b.get(), accumulate=accumulate.get()))
            return accumulate
        out.set(gemm.gemm_f16_nt_ref(a.get(), b.get(), out.dtype, glu=kw.get("glu", False)))
        return out

    monkeypatch.setattr(gemm, "gemm_f16_nt", gemm_f16_nt)
    return rt
