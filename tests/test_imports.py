"""CPU: the module graph of minfer/ (every import, module level or in a function, read with ast):
no import cycles, and the f16 GEMM path reaches no int8 module."""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def module_graph() -> dict[str, set[str]]:
    mods = {}
    for p in (ROOT / "minfer").rglob("*.py"):
        name = ".".join(p.relative_to(ROOT).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in mods:
                        graph[m].add(full)
                    elif base in mods:
                        graph[m].add(base)
        graph[m].discard(m)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        for w in graph[v] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_f16_gemm_reaches_no_int8_module():
    g = module_graph()
    int8_pkgs = ("minfer.cuda.paths.q8_1", "minfer.cuda.paths.blk")
    int8 = {
        m for m in g if m.startswith(int8_pkgs) or m.rpartition(".")[2].startswith(("mmq", "q8_1"))
    }
    assert "minfer.cuda.paths.q8_1.launch" in int8 and "minfer.cuda.paths.q8_1.twin" in int8
    assert "minfer.cuda.paths.blk.launch" in int8
    for f16 in ("minfer.cuda.paths.f16.gemm", "minfer.cuda.paths.f16"):
        assert not reach(g, f16) & int8, f16


# minfer/cuda's folders, bottom up: the runtime, the kernels' launchers, the GEMM path families,
# the planning (pure), loading a plan onto the GPU; forward.py and backend.py sit above them
LAYERS = ("runtime", "ops", "paths", "plan", "load")


def cuda_layer(m: str) -> int | None:
    parts = m.split(".")
    if parts[:2] != ["minfer", "cuda"] or len(parts) < 3:
        return None
    return LAYERS.index(parts[2]) if parts[2] in LAYERS else len(LAYERS)


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports from a lower folder of minfer/cuda into a higher one (or into backend)."""
    return sorted(
        (m, d)
        for m in graph
        for d in graph[m]
        if cuda_layer(m) is not None and cuda_layer(d) is not None and cuda_layer(d) > cuda_layer(m)
    )


def test_layer_check_finds_upward_imports():
    g = {
        "minfer.cuda.runtime.build": {"minfer.cuda.paths"},
        "minfer.cuda.paths": {"minfer.cuda.paths.q8_1.launch"},
        "minfer.cuda.paths.q8_1.launch": set(),
    }
    assert upward(g) == [("minfer.cuda.runtime.build", "minfer.cuda.paths")]


def test_cuda_folders_are_layered():
    g = module_graph()
    assert upward(g) == []
    flat = {m for m in g if cuda_layer(m) == len(LAYERS) and m.count(".") == 2}
    # the backend and its Forward sit above the folders; every other module lives in one
    assert flat == {"minfer.cuda.backend", "minfer.cuda.forward"}


def _path_name_comparisons(tree, names: set[str]) -> list[int]:
    """Lines of `tree` comparing something with a path name string (==, !=, in, not in)."""

    def consts(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for e in node.elts:
                yield from consts(e)

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            vals = [v for side in (node.left, *node.comparators) for v in consts(side)]
            if any(v in names for v in vals):
                out.append(node.lineno)
    return out


def test_no_path_name_comparisons_outside_the_path_folder():
    """What a path does is asked of its object (minfer/cuda/paths/), never decided elsewhere by
    comparing its name: a new path family is then a change in one folder."""
    from minfer.cuda.paths import TABLE

    names = set(TABLE) | {"dequant-f16", "raw", "requant-blk", "blk-operand", "blk-operand-tok"}
    bad = []
    for p in (ROOT / "minfer").rglob("*.py"):
        if "paths" in p.relative_to(ROOT / "minfer").parts[:2]:
            continue
        for line in _path_name_comparisons(ast.parse(p.read_text()), names):
            bad.append(f"{p.relative_to(ROOT)}:{line}")
    assert not bad, bad


def test_path_name_comparison_finder_finds_them():
    tree = ast.parse("a == 'blk'\nb in ('f16', 'x')\nc != 'other'\nd = 'f16'")
    assert _path_name_comparisons(tree, {"blk", "f16"}) == [1, 2]


def test_the_gemm_choice_is_read_from_the_environment_in_one_module():
    """One function (cuda/plan/config.gemm_choice, which the CLI's flags and minfer.Engine call)
    turns --gemm and MINFER_GEMM into a GemmChoice; no other module hands the environment to
    the GEMM choice, and CUDA backends are built in one place (engine.backends.make_backend)."""
    readers, builders = [], []
    for p in (ROOT / "minfer").rglob("*.py"):
        src = p.read_text()
        rel = str(p.relative_to(ROOT))
        if ("MINFER_GEMM" in src or "GemmChoice" in src) and "os.environ" in src:
            readers.append(rel)
        if "CudaBackend(" in src and "class CudaBackend" not in src:
            builders.append(rel)
    assert readers == ["minfer/cuda/plan/config.py"], readers
    assert builders == ["minfer/engine/backends.py"], builders


# minfer/'s top-level groups and what each may not import (bottom up): the host side (signals,
# threads, files, memory, pools, progress) and text know nothing of models; the file format (and
# the default model's fetch) and the quant types know no backend; batch, the driver (the packed
# layout, the schedule, the runners, the continuous scheduler), knows the backends only by their
# protocol and sits under them (they check its layout); the CUDA backend and the CPU reference
# know no command; engine (the Python API, where a backend is built) sits over the backends;
# the tools (bench, perplexity, synth, quantize, gates) under the commands, the commands under
# the CLI
TOP = (
    "cli",
    "commands",
    "tools",
    "serve",
    "engine",
    "cuda",
    "reference",
    "batch",
    "gguf",
    "families",
    "quants",
    "text",
    "host",
    "errors",
)
FORBIDDEN = {
    "errors": set(TOP) - {"errors"},
    "families": set(TOP) - {"families", "errors", "host"},  # below gguf/: read by all above
    "host": set(TOP) - {"host", "errors"},
    "text": set(TOP) - {"text", "host", "errors"},
    "gguf": {"cli", "commands", "tools", "engine", "batch", "cuda", "reference", "text", "serve"},
    "quants": {"cli", "commands", "tools", "engine", "batch", "cuda", "reference", "text", "serve"},
    "batch": {"cli", "commands", "tools", "serve", "engine", "cuda", "reference"},
    "reference": {"cli", "commands", "tools", "engine", "text", "serve"},
    "cuda": {"cli", "commands", "tools", "engine", "text", "serve"},
    "engine": {"cli", "commands", "tools", "serve"},
    "tools": {"cli", "commands", "serve"},
    "serve": {"cli", "commands"},  # the HTTP front over engine/, batch/ and the backends
    "commands": {"cli"},
    "cli": set(),
}


def _group(m: str) -> str | None:
    parts = m.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in TOP else None


def test_top_level_is_grouped_by_what_each_part_owns():
    entries = {p.name for p in (ROOT / "minfer").iterdir() if p.name != "__pycache__"}
    assert len(entries - {"__init__.py", "__main__.py", "data"}) <= 14, sorted(entries)
    bad = sorted(
        (m, d)
        for m, ds in module_graph().items()
        for d in ds
        if _group(m) and _group(d) in FORBIDDEN[_group(m)]
    )
    assert not bad, bad


# The package-level graph (issue 51's "back arrows"): a room is a top-level entry of minfer/
# (a subpackage or module; "minfer" is the package's face, __init__: __version__ and the lazy
# minfer.Engine). ROOMS ranks them top down: the two faces (the CLI and the Python API) first,
# then the commands and tools, the HTTP front, and so on down to errors. A back arrow is a pair
# of rooms (a, b), a importing b (any module of a, any import), with b ranked above a: the
# number of distinct pairs, not of imports. `python3 tests/test_imports.py` prints the graph.
ROOMS = ("__main__", "cli", "commands", "minfer", *TOP[2:])
# none: the last one (reference -> cuda, perplexity --emulate's backend reading the CUDA plan)
# went when the emulation moved to the perplexity tool, which sits above both
BACK_ARROWS_LEFT: set[tuple[str, str]] = set()


def room(m: str) -> str:
    parts = m.split(".")
    return parts[1] if len(parts) > 1 else "minfer"


def package_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], int]:
    """(room a, room b) -> how many module imports go from a to b (a != b)."""
    out: dict[tuple[str, str], int] = {}
    for m, ds in graph.items():
        for d in ds:
            if room(m) != room(d):
                key = (room(m), room(d))
                out[key] = out.get(key, 0) + 1
    return out


def back_arrows(pg: dict[tuple[str, str], int]) -> set[tuple[str, str]]:
    return {(a, b) for a, b in pg if ROOMS.index(b) < ROOMS.index(a)}


def test_back_arrow_count_finds_them():
    assert back_arrows({("quants", "gguf"): 2, ("gguf", "quants"): 1}) == {("quants", "gguf")}


def test_rooms_are_ranked_and_back_arrows_few():
    pg = package_graph(module_graph())
    assert {r for e in pg for r in e} <= set(ROOMS)
    assert back_arrows(pg) <= BACK_ARROWS_LEFT, back_arrows(pg)


if __name__ == "__main__":
    pg = package_graph(module_graph())
    back = back_arrows(pg)
    for a in ROOMS:
        outs = [f"{b}{'!' if (a, b) in back else ''}({pg[a, b]})" for b in ROOMS if (a, b) in pg]
        print(f"{a:>9} -> {' '.join(outs)}")
    print(f"back arrows ({len(back)}, marked !):", ", ".join(f"{a}->{b}" for a, b in sorted(back)))
