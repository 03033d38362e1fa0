"""minfer bench on the CPU backend (a tiny synthetic model): interleaving, table, config parsing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from synth_data import tiny_model

from minfer.cuda.plan.config import GemmChoice
from minfer.errors import BadInput
from minfer.tools.bench import ab as B


class FakeBackend:
    """bench's view of a backend: each forward appends entry(name, ids) to `log` and, with a
    `clock` ([seconds]), advances it by `secs`."""

    def __init__(self, name, log, entry=lambda name, ids: name, secs=0.0, clock=None):
        self.name, self.log, self.entry, self.secs, self.clock = name, log, entry, secs, clock

    def reset(self):
        pass

    def synchronize(self):
        pass

    def forward(self, ids, pos0):
        self.log.append(self.entry(self.name, ids))
        if self.clock is not None:
            self.clock[0] += self.secs


MODEL = SimpleNamespace(config=SimpleNamespace(vocab_size=100))


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("bench"), seed=1, qtype="q8_0")


def test_gemm_choice_env_and_ab():
    env = {"MINFER_GEMM": "wide-kd8"}
    c = GemmChoice.resolve(env)
    assert c.path == "wide-kd8" and c.label() == "wide-kd8"
    assert GemmChoice.parse_ab("MINFER_GEMM=f16", env).label() == "f16"  # the spec wins
    assert GemmChoice.parse_ab("narrow", env={}).path == "narrow"
    assert GemmChoice.parse_ab("f16:no-glu", env).label() == "f16:no-glu"
    assert GemmChoice.resolve({}) == GemmChoice()
    with pytest.raises(BadInput, match="unknown key"):
        GemmChoice.parse_ab("MINFER_FOO=1", env={})
    with pytest.raises(BadInput, match="unknown key"):
        GemmChoice.parse_ab("MINFER_MMQ=1", env={})  # the seeds' variables: MINFER_GEMM now
    with pytest.raises(BadInput, match="unknown GEMM path"):
        GemmChoice.parse_ab("MINFER_MMQ", env={})


def test_ab_all_is_the_table():
    from minfer.cuda.paths import TABLE

    assert B.expand_configs(["all"]) == list(TABLE)
    assert B.expand_configs(["f16:no-rope", "all"])[:2] == ["f16:no-rope", "f16"]
    assert B.expand_configs([""]) == [""]


def test_parse_tokens():
    assert B.parse_tokens("512,2048") == [512, 2048]
    for bad in ("", "a,b", "0", "-3"):
        with pytest.raises(BadInput):
            B.parse_tokens(bad)


def test_table_noise_verdicts():
    a = B.Row("A", "cpu", 8, [100.0, 110.0, 105.0])  # band 10/105
    b = B.Row("B", "cpu", 8, [104.0, 106.0, 108.0])  # inside A's band -> noise
    c = B.Row("C", "cpu", 8, [200.0, 201.0, 202.0])  # far outside -> faster
    from minfer.tools.bench.out import table

    t = table([a, b, c])
    lines = t.splitlines()
    assert len(lines) == 5
    assert "noise" in lines[3] and "faster" in lines[4]
    assert a.median == 105.0 and a.spread == 10.0


def test_bench_cpu_interleaved(tiny_model_path):
    rows = B.run(str(tiny_model_path), [4, 8], ["", "mmq"], 2, "cpu", echo=lambda *a: None)
    assert [(r.config, r.tokens) for r in rows] == [
        ("default", 4),
        ("mmq", 4),
        ("default", 8),
        ("mmq", 8),
    ]
    for r in rows:
        assert len(r.tok_s) == 2 and all(v > 0 for v in r.tok_s)
        assert r.backend == "cpu"


def test_bench_cli_cpu(tiny_model_path):
    from click.testing import CliRunner

    from minfer.cli import cli

    r = CliRunner().invoke(
        cli,
        [
            "bench",
            "-m",
            str(tiny_model_path),
            "--tokens",
            "3",
            "--backend",
            "cpu",
            "--repeats",
            "1",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "| config | backend | tokens | tok/s |" in r.output
    # GPU paths on the CPU backend: refused, never the CPU's rows under their names
    from cli_inproc import run_cli

    code, out, err = run_cli(
        [
            "bench",
            "-m",
            str(tiny_model_path),
            "--tokens",
            "3",
            "--backend",
            "cpu",
            "--repeats",
            "1",
            "--ab",
            "",
            "mmq",
            "f16:no-rope",
        ]
    )
    assert (code, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("error: --ab 'mmq': a GPU GEMM path")
    bad = CliRunner().invoke(
        cli, ["bench", "-m", str(tiny_model_path), "--tokens", "x", "--backend", "cpu"]
    )
    assert bad.exit_code != 0


def test_breakdown_table_rows_add_up():
    """The per-op table: GEMMs by time with TFLOP/s against the path's ceiling, then attention,
    the prepasses that ran, and the rest of the events; the rows sum to the events total."""
    tot = {
        "gemm:ffn_gate_up": [2.0, 2.0e12 * 0.5, 32],
        "gemm:ffn_down": [1.0, 0.0, 32],
        "attention": [0.25, 0.0, 32],
        "prepass": [0.125, 0.0, 97],
        "rmsnorm+prepass": [0.0625, 0.0, 32],
        "rmsnorm": [0.5, 0.0, 65],
    }
    out = B.breakdown_table("cuda-wide-kd4", 512, tot, wall_ms=4.5).splitlines()
    assert "ceiling 1267 TFLOP/s" in out[0]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in out[3:]]
    rows = {c[0]: c for c in cells}
    assert list(rows)[:2] == ["gemm:ffn_gate_up", "gemm:ffn_down"]  # by time
    assert rows["gemm:ffn_gate_up"][4] == "500.0"  # TFLOP/s
    assert "swiglu" not in rows and rows["rmsnorm+prepass"][1] == "32"  # only ops that ran
    assert rows["rest (norm, rope, embed)"][2] == "500"  # 3.9375 ms - the rows
    assert rows["all ops (events) / wall less the spins"][2] == "3,938 / 4,500"
    f16 = B.breakdown_table("cuda", 512, {"gemm:x": [1.0, 1e12, 1]}, 1.0).splitlines()
    assert "ceiling 634 TFLOP/s" in f16[0] and any(ln.startswith("| attention | 0 |") for ln in f16)


def test_bench_rotates_the_config_order():
    """Each repeat starts one config later, so over len(configs) repeats every config runs in
    every position (the config right after another one's prefill measured slower on the GPU)."""
    calls = []
    fakes = [FakeBackend(n, calls, lambda name, ids: (name, len(ids))) for n in "abc"]
    rows = B.bench(MODEL, [4, 8], ["a", "b", "c"], 3, fakes, warmup=False)
    assert calls == [
        ("a", 4),
        ("b", 4),
        ("c", 4),
        ("a", 8),
        ("b", 8),
        ("c", 8),
        ("b", 4),
        ("c", 4),
        ("a", 4),
        ("b", 8),
        ("c", 8),
        ("a", 8),
        ("c", 4),
        ("a", 4),
        ("b", 4),
        ("c", 8),
        ("a", 8),
        ("b", 8),
    ]
    assert [(r.config, r.tokens, len(r.tok_s)) for r in rows] == [
        ("a", 4, 3),
        ("b", 4, 3),
        ("c", 4, 3),
        ("a", 8, 3),
        ("b", 8, 3),
        ("c", 8, 3),
    ]


def test_bench_samples_a_preroll_then_back_to_back_prefills(monkeypatch):
    """With min_ms, a sample is one untimed pre-roll prefill and then k timed prefills filling
    min_ms (k from the warm-up prefill); a prefill longer than min_ms is timed alone."""
    clock = [0.0]
    monkeypatch.setattr(B.time, "perf_counter", lambda: clock[0])
    calls = []
    fakes = [
        FakeBackend("fast", calls, secs=0.03, clock=clock),
        FakeBackend("slow", calls, secs=0.5, clock=clock),
    ]
    rows = B.bench(MODEL, [10], ["fast", "slow"], 2, fakes, min_ms=200)
    # warm-up (fast twice: its first prefill would record the graph; slow once: already over
    # min_ms), then per repeat: fast = 1 pre-roll + 7 timed (7 x 30 ms >= 200 ms), slow = 1
    # timed; the second repeat starts with slow
    assert calls == ["fast", "fast", "slow"] + ["fast"] * 8 + ["slow"] + ["slow"] + ["fast"] * 8
    fast, slow = rows
    assert (fast.prefills, slow.prefills) == (7, 1)
    assert fast.tok_s == pytest.approx([10 / 0.03] * 2) and slow.tok_s == pytest.approx([20.0] * 2)


@pytest.mark.parametrize(
    "n,ubatch,window",
    [
        (1, 4096, 0),
        (2048, 4096, 0),
        (5000, 2048, 0),
        (4097, 4096, 0),
        (3000, 1024, 700),
        (300, 64, 1),
    ],
)
def test_attention_flops_count_the_rows_the_forward_computes(n, ubatch, window):
    """The breakdown's attention FLOPs: 4 Hq D per (query row, visible key), keys capped at a
    local layer's window, the last chunk's final layer its last row alone; against a count
    row by row."""

    L, H, D = 3, 4, 64
    c = SimpleNamespace(
        n_layers=L,
        n_heads=H,
        head_dim=D,
        sliding_window=window,
        is_local=lambda il: window > 0 and il % 2 == 0,
    )
    want = 0
    last0 = (n - 1) // ubatch * ubatch
    for il in range(L):
        rows = range(n) if il < L - 1 else [*range(last0), n - 1]
        w = window if c.is_local(il) else n
        want += sum(min(t + 1, w) for t in rows)
    assert B.attention_flops(c, n, ubatch) == 4.0 * H * D * want


def test_breakdown_attention_row_has_its_rate():
    """With the attention's FLOPs the breakdown prints its TFLOP/s (no int8 ceiling ratio)."""
    tot = {"gemm:x": [1.0, 1e12, 1], "attention": [0.5, 2.5e11, 32]}
    out = B.breakdown_table("cuda-blk", 2048, tot, 1.6).splitlines()
    row = next(ln for ln in out if ln.startswith("| attention |"))
    assert [c.strip() for c in row.strip("|").split("|")] == [
        "attention",
        "32",
        "500",
        "33.3",
        "500.0",
        "",
    ]


def test_single_prefills_start_from_an_idle_gpu(monkeypatch):
    """min_ms 0: each sample is one prefill after idle_s of sleep (what `minfer prefill` times:
    right after another config's prefill the board is at its power cap); sustained samples
    never sleep."""
    events = []
    monkeypatch.setattr(B.time, "sleep", lambda s: events.append(("sleep", s)))
    B.bench(
        MODEL,
        [4],
        ["a", "b"],
        2,
        [FakeBackend(n, events) for n in "ab"],
        warmup=False,
        min_ms=0,
        idle_s=1.5,
    )
    assert events == [
        ("sleep", 1.5),
        "a",
        ("sleep", 1.5),
        "b",
        ("sleep", 1.5),
        "b",
        ("sleep", 1.5),
        "a",
    ]
    events.clear()
    B.bench(MODEL, [4], ["a"], 1, [FakeBackend("a", events)], warmup=False, min_ms=500, idle_s=1.5)
    assert ("sleep", 1.5) not in events


def test_bench_idle_flag_is_checked(tmp_path):
    from cli_inproc import error_lines, run_cli

    for args in (["--idle-s", "-1", "--min-ms", "0"], ["--idle-s", "1"]):  # before the model
        code, _, err = run_cli(
            ["bench", "-m", str(tmp_path / "absent.gguf"), "--backend", "cpu", *args]
        )
        assert code != 0 and len(error_lines(err)) == 1 and "--idle-s" in err, err


# -- llama-bench's habits: the backend picked as prefill picks it, -m repeated, its field names --
def test_bench_defaults_to_cpu_without_a_gpu(tiny_model_path, monkeypatch):
    import json

    from cli_inproc import run_cli

    import minfer.cuda.runtime.runtime as rt

    monkeypatch.setattr(rt, "gpu_available", lambda: False)
    code, out, err = run_cli(
        [
            "bench",
            "-m",
            str(tiny_model_path),
            "-p",
            "3",
            "-r",
            "1",
            "--min-ms",
            "0",
            "-o",
            "json",
            "--no-breakdown",
        ]
    )
    assert code == 0, err  # once: exit 3, "no usable CUDA GPU"
    assert [r["backend"] for r in json.loads(out)] == ["cpu"]


def test_bench_runs_every_model_with_llama_bench_fields(tiny_model_path, tmp_path):
    import csv
    import io
    import json
    import shutil

    from cli_inproc import run_cli

    from minfer.tools.bench.out import LLAMA_FIELDS

    other = tmp_path / "other.gguf"
    shutil.copy(tiny_model_path, other)
    argv = [
        "bench",
        "-m",
        str(tiny_model_path),
        "-m",
        str(other),
        "--backend",
        "cpu",
        "-p",
        "3,4",
        "-r",
        "2",
        "--min-ms",
        "0",
        "--no-breakdown",
    ]
    code, out, err = run_cli(argv + ["-o", "json"])
    assert code == 0, err
    recs = json.loads(out)  # one array for both models
    assert [(r["model_filename"], r["n_prompt"]) for r in recs] == [
        (str(tiny_model_path), 3),
        (str(tiny_model_path), 4),
        (str(other), 3),
        (str(other), 4),
    ]
    for r in recs:
        assert set(LLAMA_FIELDS) <= set(r)
        assert r["n_gen"] == 0 and r["backends"] == "CPU" and r["model_n_params"] > 0
        assert r["model_type"].startswith("llama ") and r["model_size"] > 0
        assert len(r["samples_ts"]) == len(r["samples_ns"]) == 2
        assert r["avg_ts"] == pytest.approx(sum(r["samples_ts"]) / 2)
        assert r["avg_ns"] == pytest.approx(sum(r["samples_ns"]) / 2)  # llama-bench's means
        for ns, ts in zip(r["samples_ns"], r["samples_ts"]):  # each sample: tokens / its time
            assert ts == pytest.approx(r["n_prompt"] / ns * 1e9, rel=1e-6)
        assert min(r["samples_ts"]) <= r["avg_ts"] <= max(r["samples_ts"])
    code, out, err = run_cli(argv + ["-o", "jsonl"])
    assert code == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert len(lines) == 4 and all("avg_ts" in x for x in lines)
    code, out, err = run_cli(argv[:3] + argv[5:] + ["-o", "csv"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 2, err
    assert list(rows[0])[: len(LLAMA_FIELDS)] == list(LLAMA_FIELDS)
    assert float(rows[0]["avg_ts"]) > 0 and rows[1]["n_prompt"] == "4"
