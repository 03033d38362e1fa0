"""CLI conventions (issue 20): bench -o md|json|csv and --plot, bench progress on terminals,
inspect --json, check/bench on the default model, option and backend checks before the model
fetch, type names in any case."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from synth_data import tiny_model

from minfer.cli import cli, main


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("conv"), seed=2, qtype="q8_0")


def _main(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    out, err = capsys.readouterr()
    return e.value.code, out, err


def _no_gpu():
    from minfer.cuda.runtime.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")


@pytest.fixture
def no_fetch(monkeypatch, tmp_path):
    """An empty models folder whose fetch fails the test: a command must stop before it."""
    import minfer.gguf.fetch as F

    monkeypatch.setenv("MINFER_MODELS", str(tmp_path / "models"))
    monkeypatch.setattr(F.subprocess, "run", lambda *a, **k: pytest.fail("model fetched"))
    monkeypatch.setattr(F, "_fetch", lambda *a, **k: pytest.fail("model fetched"))
    return tmp_path / "models"


# -- bench output formats ------------------------------------------------------------------------
# one config: the CPU backend refuses a GPU path's --ab config (issue 36, test_bench_honest)
BENCH = ["bench", "--backend", "CPU", "--tokens", "3,5", "--repeats", "2", "--min-ms", "0"]


def test_bench_json(capsys, tiny):
    code, out, err = _main(capsys, *BENCH[:1], "-m", str(tiny), *BENCH[1:], "-o", "json")
    assert code == 0, err
    recs = json.loads(out)  # stdout is exactly the JSON; the rest went to stderr
    assert [(r["config"], r["n_prompt"]) for r in recs] == [("default", 3), ("default", 5)]
    for r in recs:
        assert r["backend"] == "cpu" and r["model"] == str(tiny)
        assert len(r["samples_tok_s"]) == 2 and r["tok_s"] > 0
        assert min(r["samples_tok_s"]) <= r["tok_s"] <= max(r["samples_tok_s"])
        assert (r["min_ms"], r["idle_s"]) == (0, 0)  # the regime (no idle gap on a CPU)
    assert "backend cpu" in err


def test_bench_csv_and_md(capsys, tiny):
    code, out, err = _main(capsys, *BENCH[:1], "-m", str(tiny), *BENCH[1:], "-o", "CSV")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 2 and rows[0]["config"] == "default" and rows[1]["n_prompt"] == "5"
    assert all(len(r["samples_tok_s"].split()) == 2 and float(r["tok_s"]) > 0 for r in rows)
    code, out, err = _main(capsys, *BENCH[:1], "-m", str(tiny), *BENCH[1:])
    assert code == 0, err
    assert "| config | backend | tokens | tok/s |" in out and "repeat(s)" in out


def test_bench_progress_only_on_a_terminal(monkeypatch, tiny):
    from minfer.gguf.loader import load_model
    from minfer.tools.bench import ab as B

    class Tty(io.StringIO):
        def isatty(self):
            return True

    model = load_model(tiny)
    from minfer.engine.backends import make_backend

    bes = [make_backend("cpu", model, None, 4, progress=False)]
    for stream, shown in ((Tty(), True), (io.StringIO(), False)):
        monkeypatch.setattr(sys, "stderr", stream)
        rows = B.bench(model, [2, 4], [""], 2, bes, min_ms=0, progress=True)
        assert len(rows) == 2
        text = stream.getvalue()
        assert ("bench:" in text and "/6 " in text and "sample" in text) == shown, text


def test_bench_plot_without_matplotlib_fails_before_benchmarking(
    monkeypatch, capsys, tiny, tmp_path
):
    import minfer.tools.bench.ab

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setattr(minfer.tools.bench.ab, "run", lambda *a, **k: pytest.fail("benchmarked"))
    code, out, err = _main(
        capsys, *BENCH[:1], "-m", str(tiny), *BENCH[1:], "--plot", str(tmp_path / "p.png")
    )
    assert code == 3 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: --plot needs matplotlib")
    assert ".[plot]" in err and not (tmp_path / "p.png").exists()


def test_bench_plot_writes_an_image(capsys, tiny, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    code, out, err = _main(capsys, *BENCH[:1], "-m", str(tiny), *BENCH[1:], "--plot", str(png))
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["bench.png"]  # no temporary left
    code, out, err = _main(
        capsys, *BENCH[:1], "-m", str(tiny), *BENCH[1:], "--plot", str(tmp_path / "b.nope")
    )
    assert code == 2 and "unknown image format" in err


# -- defaults and checks before the default model is fetched ---------------------------------------
def test_bench_defaults_to_the_default_model(monkeypatch, capsys, tmp_path):
    import minfer.gguf.fetch as F
    import minfer.tools.bench.ab

    seen = {}
    default = tmp_path / "default.gguf"
    monkeypatch.setattr(F, "default_model_path", lambda fetch=True: default)
    monkeypatch.setattr(
        minfer.tools.bench.ab, "run", lambda path, *a, **k: seen.setdefault("p", path) and []
    )
    code, _, err = _main(capsys, "bench", "--backend", "cpu", "--no-breakdown")
    assert code == 0, err
    assert seen["p"] == default


@pytest.mark.parametrize(
    "argv,code,needle",
    [
        (["bench", "--backend", "cuda"], 3, "--backend cpu"),  # no GPU here (default: cpu then)
        (["bench", "--backend", "cpu", "--tokens", "0"], 2, "--tokens"),
        (["bench", "--backend", "cpu", "--repeats", "0"], 2, "--repeats"),
        (["bench", "--backend", "cpu", "--min-ms", "-1"], 2, "--min-ms"),
        (["bench", "--backend", "cpu", "--ab", "f16", "blk"], 2, "--ab 'f16': a GPU GEMM path"),
        (["bench", "--backend", "cpu", "--gemm", "blk"], 2, "--gemm blk: a GPU GEMM path"),
        (["check"], 3, "needs a CUDA GPU"),
    ],
)
def test_checks_before_the_model_fetch(capsys, no_fetch, argv, code, needle):
    if code == 3:
        _no_gpu()
    got, out, err = _main(capsys, *argv)
    assert got == code and out == "" and needle in err, err
    assert err.count("\n") == 1 and "fetching" not in err and not no_fetch.exists()


def test_check_message_does_not_offer_an_option_it_lacks(capsys, no_fetch):
    _no_gpu()
    code, out, err = _main(capsys, "check")
    assert code == 3
    # "use --backend cpu" was advice check cannot take (it has no --backend); the CPU
    # reference is named as the prefill command it is
    assert "use --backend cpu" not in err and "minfer prefill --backend cpu" in err


def test_check_defaults_to_the_default_model(monkeypatch, capsys, tmp_path):
    from types import SimpleNamespace

    import minfer.cuda.runtime.runtime as R
    import minfer.gguf.fetch as F
    import minfer.gguf.loader
    from minfer.errors import BadInput

    default = tmp_path / "default.gguf"
    monkeypatch.setattr(R, "get_runtime", lambda cfg=None: SimpleNamespace(cfg=cfg))
    monkeypatch.setattr(F, "default_model_path", lambda fetch=True: default)

    def load(path):
        raise BadInput(f"loading {path}")

    monkeypatch.setattr(minfer.gguf.loader, "load_model", load)
    code, out, err = _main(capsys, "check")
    assert code == 2 and err.strip() == f"error: loading {default}"


# -- inspect --json ------------------------------------------------------------------------------
def test_inspect_json(tiny):
    r = CliRunner().invoke(cli, ["inspect", str(tiny), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    from minfer.gguf.loader import load_model

    m = load_model(tiny)
    assert d["n_tensors"] == len(m.tensors) == len(d["tensors"])
    assert d["bytes"] == sum(int(t.data.nbytes) for t in m.tensors.values())
    assert d["config"]["n_layers"] == m.config.n_layers
    t0 = d["tensors"][0]
    assert set(t0) == {"name", "type", "shape", "bytes"}
    assert d["metadata"]["general.architecture"] == "llama"
    assert d["metadata_array_lengths"]["tokenizer.ggml.tokens"] == m.config.vocab_size
    full = json.loads(
        CliRunner().invoke(cli, ["inspect", str(tiny), "--json", "--all-metadata"]).output
    )
    assert len(full["metadata"]["tokenizer.ggml.tokens"]) == m.config.vocab_size


# -- type names in any case --------------------------------------------------------------------
def test_synth_type_and_preset_in_any_case(tmp_path):
    out = tmp_path / "s.gguf"
    r = CliRunner().invoke(
        cli,
        [
            "synth",
            "-o",
            str(out),
            "--preset",
            "TINY",
            "--type",
            "q4_k_m",
            "--layers",
            "1",
            "--vocab",
            "300",
            "--tokenizer-from",
            "none",
            "--workers",
            "1",
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "q4_K_M" in r.output and "tiny" in r.output
    from minfer.gguf.loader import load_model

    assert load_model(out).tensor("blk.0.ffn_gate.weight").type_name == "Q4_K"


def test_backend_and_dtype_in_any_case(capsys, tiny):
    code, out, err = _main(
        capsys,
        "prefill",
        "-m",
        str(tiny),
        "--backend",
        "CPU",
        "--dtype",
        "F64",
        "-p",
        "hi",
        "-n",
        "1",
        "--json",
    )
    assert code == 0, err
    assert json.loads(out)["backend"] == "cpu-f64"


def test_help_lists_the_llama_cpp_names():
    h = CliRunner().invoke(cli, ["prefill", "--help"]).output
    for opt in (
        "-n, --n-predict, --greedy",
        "-c, --ctx-size",
        "--chat / --no-chat",
        "--system",
        "--special / --no-special",
        "--stop-at-eos / --no-stop-at-eos",
    ):
        assert opt in h, opt
    assert "-o, --output [md|json|csv|jsonl]" in CliRunner().invoke(cli, ["bench", "--help"]).output


# -- the README a newcomer reads ---------------------------------------------------------------
def test_readme_is_short_and_its_commands_exist():
    import re

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    # the server got a section, the pooled jobs (embed, score, rerank) a paragraph
    assert len(readme.encode()) <= 10000, len(readme.encode())
    # CI (.ci/run) runs exactly these two
    assert '\npip install -e ".[dev]" && minfer prefill\n' in readme
    assert '\npip install -e ".[dev]" && python3 -m pytest -q\n' in readme
    named = set(re.findall(r"^- `minfer ([\w-]+)", readme, re.M))
    assert named == set(cli.commands), named
    # every prefill option the README names is one prefill has
    h = CliRunner().invoke(cli, ["prefill", "--help"]).output
    section = readme[readme.index("## Commands") : readme.index("## Figures")]
    line = next(ln for ln in section.splitlines() if ln.startswith("- `minfer prefill"))
    for opt in set(re.findall(r"(--?[a-z][a-z-]*)", line)) | {"--no-special", "--stop-at-eos"}:
        assert re.search(rf"(^|[\s,/]){re.escape(opt)}\b", h), opt
