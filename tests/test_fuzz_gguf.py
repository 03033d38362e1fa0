"""GGUF fuzzing: >= 10,000 mutated files fed to minfer.gguf.loader.load_model.

Every case must either load (and build its tokenizer, encode, decode) or raise a MinferError (one-line message): no other exception,
no hang (a per-case alarm), bounded memory (peak RSS growth of the worker after warm-up, and an
address-space limit that turns a runaway allocation into a failure instead of an OOM).

Seeds: tests/fuzz_corpus/make_corpus.py (tiny valid llama/qwen2 models). Mutations are aimed
with the layout that minfer.gguf.header.scan_gguf records (where each count, length, type,
dim and offset lives): truncations, bit flips, field rewrites to absurd values, byte
overwrites, inserted/deleted spans, splices of two seeds, and stacks of those.
The cases run in two worker processes (CI has 2 cores), each reusing one temp path.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
N_CASES = int(os.environ.get("MINFER_FUZZ_CASES", "10000"))
N_WORKERS = 2
CASE_ALARM_S = 10  # a case slower than this counts as a hang
RSS_GROWTH_MAX_MB = 200

_ABSURD = [
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    9,
    12,
    13,
    16,
    31,
    32,
    33,
    63,
    64,
    255,
    256,
    4095,
    4096,
    0x7FFF_FFFF,
    0x8000_0000,
    0xFFFF_FFFF,
    1 << 32,
    (1 << 32) + 1,
    1 << 40,
    1 << 61,
    1 << 62,
    (1 << 62) - 1,
    1 << 63,
    (1 << 64) - 1,
    (1 << 64) - 2,
]


# -- mutations (used by the worker) -------------------------------------------------------------
def _rewrite(buf: bytearray, f, rng: random.Random, size: int, align: int) -> str:
    old = int.from_bytes(buf[f.pos : f.pos + f.width], "little")
    cands = _ABSURD + [
        size,
        size - 1,
        size + 1,
        old + 1,
        old - 1,
        old * 2,
        old + align,
        old ^ (1 << rng.randrange(8 * f.width)),
        rng.getrandbits(8 * f.width),
    ]
    if f.kind in ("value_type", "arr_type", "tensor_type"):
        cands += list(range(0, 45))
    v = rng.choice(cands) % (1 << (8 * f.width))
    buf[f.pos : f.pos + f.width] = v.to_bytes(f.width, "little")
    return f"rewrite {f.kind}@{f.pos} {old}->{v}"


def mutate(seed: bytes, layout, other: bytes, rng: random.Random) -> tuple[bytes, str]:
    buf = bytearray(seed)
    head = max(layout.data_start, 24)
    steps = []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.random()
        n = len(buf)
        if n == 0:
            break
        if op < 0.12:  # truncation, mostly inside the header
            cut = rng.randrange(min(head + 64, n)) if rng.random() < 0.8 else rng.randrange(n)
            del buf[cut:]
            steps.append(f"truncate {cut}")
        elif op < 0.30:  # bit flips, mostly in the header
            for _ in range(rng.randint(1, 4)):
                p = rng.randrange(min(head, n)) if rng.random() < 0.9 else rng.randrange(n)
                buf[p] ^= 1 << rng.randrange(8)
                steps.append(f"flip {p}")
        elif op < 0.75:  # aimed rewrite of a count / length / type / dim / offset
            fs = [f for f in layout.fields if f.pos + f.width <= len(buf)]
            if fs:
                steps.append(_rewrite(buf, rng.choice(fs), rng, len(buf), layout.alignment))
        elif op < 0.85:  # random bytes over a short span of the header
            p = rng.randrange(min(head, n))
            k = rng.randint(1, 16)
            buf[p : p + k] = rng.randbytes(k)
            steps.append(f"overwrite {p}+{k}")
        elif op < 0.93:  # insert or delete a span (shifts everything after it)
            p = rng.randrange(min(head, n))
            k = rng.randint(1, 12)
            if rng.random() < 0.5:
                buf[p:p] = rng.randbytes(k)
                steps.append(f"insert {p}+{k}")
            else:
                del buf[p : p + k]
                steps.append(f"delete {p}+{k}")
        else:  # splice: this file's head, another file's tail
            p = rng.randrange(min(head, n))
            q = rng.randrange(len(other))
            buf = buf[:p] + bytearray(other[q:])
            steps.append(f"splice {p}|{q}")
    return bytes(buf), "; ".join(steps)


def _worker(corpus: Path, n_cases: int, seed: int, out: Path, tmp: Path) -> None:
    import resource
    import signal

    from minfer.errors import MinferError
    from minfer.gguf.header import scan_gguf
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    seeds = sorted(corpus.glob("*.gguf"))
    datas = [p.read_bytes() for p in seeds]
    layouts = [scan_gguf(d, p.name, record=True) for p, d in zip(seeds, datas)]
    for p in seeds:  # warm-up: every seed loads
        load_model(p)

    class Hang(Exception):
        pass

    def alarm(signum, frame):
        raise Hang()

    signal.signal(signal.SIGALRM, alarm)
    # an address-space cap: a runaway allocation fails fast as MemoryError (a failure here)
    with open("/proc/self/status") as f:
        vm = next(int(x.split()[1]) for x in f if x.startswith("VmSize:")) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.RLIM_INFINITY))
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    rng = random.Random(seed)
    path = tmp / "case.gguf"
    staging = tmp / "case.tmp"
    outcomes: dict[str, int] = {}
    failures = []
    seen = set()
    max_t, done, tries = 0.0, 0, 0
    t_start = time.perf_counter()
    while done < n_cases and tries < 4 * n_cases:
        tries += 1
        i = rng.randrange(len(datas))
        data, what = mutate(datas[i], layouts[i], datas[rng.randrange(len(datas))], rng)
        h = hash(data)
        if h in seen:
            continue  # count distinct files only
        seen.add(h)
        staging.write_bytes(data)
        os.replace(staging, path)  # a fresh inode: no old memory map sees the new bytes
        t0 = time.perf_counter()
        signal.alarm(CASE_ALARM_S)
        try:
            m = load_model(path)
            key = "loaded"
            # the tokenizer is built from the same (possibly damaged) metadata
            tok = Tokenizer.from_metadata(m.metadata)
            tok.decode(tok.encode("hello 123 <|endoftext|>", parse_special=True), special=True)
            key = "loaded+tokenizer"
            del m, tok
        except MinferError as e:
            key = type(e).__name__
            msg = str(e)
            if "\n" in msg or not msg:
                failures.append((seeds[i].name, what, "multi-line or empty message", msg[:300]))
        except Hang:
            key = "HANG"
            failures.append((seeds[i].name, what, "hang", f"> {CASE_ALARM_S} s"))
        except BaseException as e:  # noqa: BLE001 - that is the point of a fuzzer
            key = "OTHER"
            failures.append((seeds[i].name, what, type(e).__name__, str(e)[:300]))
        finally:
            signal.alarm(0)
        max_t = max(max_t, time.perf_counter() - t0)
        outcomes[key] = outcomes.get(key, 0) + 1
        done += 1
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out.write_text(
        json.dumps(
            {
                "cases": done,
                "outcomes": outcomes,
                "failures": failures[:50],
                "n_failures": len(failures),
                "max_case_s": max_t,
                "rss_growth_mb": (rss1 - rss0) / 1024,
                "wall_s": time.perf_counter() - t_start,
            }
        )
    )


# -- the tests --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    sys.path.insert(0, str(HERE / "fuzz_corpus"))
    try:
        from make_corpus import make_corpus
    finally:
        sys.path.pop(0)
    d = tmp_path_factory.mktemp("fuzz_corpus")
    make_corpus(d)
    return d


def test_seeds_are_valid(corpus):
    from minfer.gguf.header import read_header
    from minfer.gguf.loader import load_model

    seeds = sorted(corpus.glob("*.gguf"))
    assert len(seeds) >= 4
    types = set()
    for p in seeds:
        assert p.stat().st_size < 64 * 1024
        lay = read_header(p)
        m = load_model(p)
        assert len(m.tensors) == lay.n_tensors
        types |= {t.type_name for t in m.tensors.values()}
    assert {"F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K"} <= types


def test_fuzz_load_model(corpus, tmp_path, report):
    per = -(-N_CASES // N_WORKERS)
    procs = []
    for w in range(N_WORKERS):
        wd = tmp_path / f"w{w}"
        wd.mkdir()
        procs.append(
            (
                wd,
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--worker",
                        str(corpus),
                        str(per),
                        str(1000 + w),
                        str(wd / "out.json"),
                        str(wd),
                    ],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
        )
    results = []
    for wd, p in procs:
        log, _ = p.communicate(timeout=600)
        assert p.returncode == 0, log[-3000:]
        results.append(json.loads((wd / "out.json").read_text()))
    total = sum(r["cases"] for r in results)
    outcomes: dict[str, int] = {}
    for r in results:
        for k, v in r["outcomes"].items():
            outcomes[k] = outcomes.get(k, 0) + v
    report(
        f"fuzz: {total} distinct mutated GGUF cases, outcomes {outcomes}, "
        f"max case {max(r['max_case_s'] for r in results):.2f} s, "
        f"worker wall {max(r['wall_s'] for r in results):.1f} s, "
        f"RSS growth {max(r['rss_growth_mb'] for r in results):.1f} MB"
    )
    failures = [f for r in results for f in r["failures"]]
    assert not failures, "\n".join(map(str, failures[:20]))
    assert total >= N_CASES
    assert outcomes.get("loaded+tokenizer", 0) > 0 and outcomes.get("BadModel", 0) > total // 4
    assert max(r["rss_growth_mb"] for r in results) < RSS_GROWTH_MAX_MB


if __name__ == "__main__" and len(sys.argv) == 7 and sys.argv[1] == "--worker":
    sys.path.insert(0, str(HERE.parent))
    _worker(
        Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), Path(sys.argv[5]), Path(sys.argv[6])
    )
