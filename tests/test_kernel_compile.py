"""CI (no GPU): every kernels/*.cu compiles with nvcc for its archs and ptxas's resources are sane.

Archs: sm_80 and sm_90, unless the file's header says otherwise with a line
`// minfer-archs: sm_90a` (space/comma separated; a trailing "(...)" is a comment). Per entry, from `-Xptxas -v`: no spill
stores or loads, no local stack frame (unless the header allows it for that entry with
`// minfer-allow-stack: entry_a entry_b`, or `*`), static shared memory <= 48 KB (dynamic
budgets are checked by the launchers against the device's opt-in cap).
The files compile in a pool of 2 threads (CI has 2 cores); a new .cu is covered automatically.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from minfer.cuda.runtime.build import KERNEL_DIR, KernelResources, compile_cubin, nvcc, parse_ptxas
from minfer.errors import GPUError

DEFAULT_ARCHS = ("sm_80", "sm_90")
STATIC_SMEM_MAX = 48 * 1024
SOURCES = sorted(p.name for p in KERNEL_DIR.glob("*.cu"))

try:
    nvcc()
    HAVE_NVCC = True
except GPUError:
    HAVE_NVCC = False


def directives(text: str) -> tuple[tuple[str, ...], set[str]]:
    """(archs, entries allowed a stack frame) from the `// minfer-...:` lines of a source."""
    archs: tuple[str, ...] = DEFAULT_ARCHS
    allow: set[str] = set()
    for m in re.finditer(r"^//\s*minfer-(archs|allow-stack):(.*)$", text, re.M):
        rest = m.group(2).split("(")[0]  # a trailing "(why ...)" is commentary
        words = tuple(w for w in re.split(r"[\s,]+", rest.strip()) if w)
        if m.group(1) == "archs":
            archs = words
        else:
            allow |= set(words)
    return archs, allow


def problems(res: dict[str, KernelResources], allow_stack: set[str]) -> list[str]:
    """What is wrong with one compile's resources (empty list: fine)."""
    out = []
    if not res:
        out.append("ptxas reported no kernels")
    for r in res.values():
        if r.spill_stores or r.spill_loads:
            out.append(f"{r.name}: spills {r.spill_stores} B stores / {r.spill_loads} B loads")
        if r.stack and "*" not in allow_stack and r.name not in allow_stack:
            out.append(f"{r.name}: {r.stack} B stack frame (allow with // minfer-allow-stack:)")
        if r.smem_static > STATIC_SMEM_MAX:
            out.append(f"{r.name}: {r.smem_static} B static shared memory > {STATIC_SMEM_MAX}")
    return out


def _compile(src: str, arch: str) -> tuple[str, str]:
    """(ptxas report, error) of one compile."""
    try:
        return compile_cubin(src, arch, report=True)[1], ""
    except GPUError as e:
        return "", str(e)


@pytest.fixture(scope="module")
def compiled(request):
    """Futures {(src, arch): (report, error)} for the sources this session selected, compiled
    two at a time in the background; each test waits for its own."""
    wanted = sorted(
        {
            it.callspec.params["src"]
            for it in request.session.items
            if it.originalname == "test_kernel_compiles" and hasattr(it, "callspec")
        }
    )
    ex = ThreadPoolExecutor(2)
    futs = {}
    for src in wanted:
        archs, _ = directives((KERNEL_DIR / src).read_text())
        for arch in archs:
            futs[(src, arch)] = ex.submit(_compile, src, arch)
    yield futs
    ex.shutdown(wait=True)


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not found")
@pytest.mark.parametrize("src", SOURCES)
def test_kernel_compiles(compiled, src):
    text = (KERNEL_DIR / src).read_text()
    assert text.startswith("//"), f"{src} must open with a header comment (what, variants, entries)"
    archs, allow = directives(text)
    assert archs, f"{src}: empty // minfer-archs: line"
    bad = []
    for arch in archs:
        report, err = compiled[(src, arch)].result()
        if err:
            bad.append(f"[{arch}] {err}")
            continue
        bad += [f"[{arch}] {p}" for p in problems(parse_ptxas(report), allow)]
    assert not bad, f"{src}:\n" + "\n".join(bad)


def test_directives_parse():
    text = (
        "// x.cu: thing\n// minfer-archs: sm_90a, sm_100a  (Hopper and Blackwell only)\n"
        "// minfer-allow-stack: k1 k2\n"
    )
    assert directives(text) == (("sm_90a", "sm_100a"), {"k1", "k2"})
    assert directives("// plain\n") == (DEFAULT_ARCHS, set())


def test_problems_flags_spills_stack_and_smem():
    ok = KernelResources("ok", 32, 1024, 0, 0, 0)
    assert problems({"ok": ok}, set()) == []
    bad = {
        "spill": KernelResources("spill", 255, 0, 0, 8, 8),
        "stack": KernelResources("stack", 40, 0, 16, 0, 0),
        "smem": KernelResources("smem", 40, 49 * 1024, 0, 0, 0),
    }
    msgs = problems(bad, set())
    assert len(msgs) == 3 and any("spills" in m for m in msgs)
    assert len(problems(bad, {"stack"})) == 2
    assert problems({}, set()) == ["ptxas reported no kernels"]


def test_parse_ptxas_reads_spills():
    report = """ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers, 20 bytes smem, 368 bytes cmem[0]
"""
    r = parse_ptxas(report)["k"]
    assert (r.stack, r.spill_stores, r.spill_loads, r.registers, r.smem_static) == (
        24,
        8,
        12,
        255,
        20,
    )


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_NVCC, reason="nvcc not found")
def test_attention_small_geometry_compiles():
    """attention.cu's fallback block shape (attention.SMALL, for GPUs whose smem opt-in cap is
    under the default's 139 KB, and for head_dim 256 everywhere) builds without spills for
    sm_80 and sm_90 too, with the head_dim 256 entry the default build leaves out."""
    from minfer.cuda.ops.attention import SMALL

    for arch in DEFAULT_ARCHS:
        _, report = compile_cubin("attention", arch, SMALL.options(), report=True)
        res = parse_ptxas(report)
        assert not problems(res, set()), (arch, report)
        assert {f"attn_fwd_d{d}" for d in (64, 96, 128, 256)} <= set(res), sorted(res)


def test_attention_geometry_pick():
    """The launcher takes 8 warps x 128 keys where the GPU's opt-in smem allows it (sm_90:
    227 KB), 4 x 64 under it (sm_86: 99 KB)."""
    from minfer.cuda.ops.attention import DEFAULT, SMALL, pick_geometry, smem_bytes

    class _Rt:
        def __init__(self, cap):
            self.smem_optin = cap

    assert smem_bytes(128, DEFAULT) == 2 * 2 * 128 * 136 * 2 and (DEFAULT.rows, SMALL.rows) == (
        128,
        64,
    )
    assert pick_geometry(_Rt(232448), 128) == DEFAULT
    assert pick_geometry(_Rt(101376), 128) == SMALL and smem_bytes(128, SMALL) <= 101376
    assert pick_geometry(_Rt(101376), 64) == DEFAULT  # (64 + 8) x 2 x 2 x 128 x 2 = 73,728 B
    assert pick_geometry(_Rt(232448), 96) == DEFAULT
    assert pick_geometry(_Rt(232448), 256) == SMALL  # attention.cu's _d256 build
