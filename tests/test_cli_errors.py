"""`minfer` exit codes and messages for bad input: 2 for a bad file/prompt, 1 for usage.

Each failure must print exactly one line `error: ...` on stderr (click's own usage message
for exit 1) and never a traceback. Runs minfer.cli.main in-process (fast), plus one real
subprocess run to check the installed entry point end to end.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def _make_corpus_module():
    sys.path.insert(0, str(HERE / "fuzz_corpus"))
    try:
        import make_corpus
    finally:
        sys.path.pop(0)
    return make_corpus


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import gguf

    from minfer.gguf.header import scan_gguf

    mc = _make_corpus_module()
    d = tmp_path_factory.mktemp("cli_errors")
    good = mc.write_seed(d / "good.gguf", "llama_q8_f16")
    data = good.read_bytes()
    f = {"good": good, "missing": d / "no_such_model.gguf"}

    f["text"] = d / "notes.gguf"
    f["text"].write_text("this is not a model\n")
    f["empty"] = d / "empty.gguf"
    f["empty"].write_bytes(b"")
    f["truncated"] = d / "truncated.gguf"
    f["truncated"].write_bytes(data[: len(data) // 3])
    f["truncated_data"] = d / "truncated_data.gguf"
    f["truncated_data"].write_bytes(data[:-100])

    f["arch"] = d / "falcon.gguf"
    w = gguf.GGUFWriter(str(f["arch"]), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 32), "float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    # output_norm.weight: F32 -> I32 (same 4 bytes per element): structurally fine, a tensor
    # type minfer does not support
    lay = scan_gguf(data, "good", record=True)
    type_fields = [x for x in lay.fields if x.kind == "tensor_type"]
    k = [t[0] for t in lay.tensors].index("output_norm.weight")
    buf = bytearray(data)
    pos = type_fields[k].pos
    assert int.from_bytes(buf[pos : pos + 4], "little") == int(gguf.GGMLQuantizationType.F32)
    buf[pos : pos + 4] = int(gguf.GGMLQuantizationType.I32).to_bytes(4, "little")
    f["qtype"] = d / "i32_norm.gguf"
    f["qtype"].write_bytes(bytes(buf))

    f["bad_utf8_prompt"] = d / "prompt.txt"
    f["bad_utf8_prompt"].write_bytes(b"hello \xff\xfe world")
    return f


def _run(capsys, argv):
    from minfer.cli import main

    with pytest.raises(SystemExit) as ei:
        main(argv)
    out, err = capsys.readouterr()
    return ei.value.code, out, err


def _assert_one_error_line(err: str, *needles: str):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, err)


@pytest.mark.parametrize(
    "case,needles",
    [
        ("missing", ["no_such_model.gguf", "no such file"]),
        ("text", ["notes.gguf", "not a GGUF file"]),
        ("empty", ["empty.gguf"]),
        ("truncated", ["truncated.gguf"]),
        ("truncated_data", ["truncated_data.gguf", "outside"]),
        ("arch", ["falcon.gguf", "unsupported architecture 'falcon'"]),
        ("qtype", ["i32_norm.gguf", "output_norm.weight", "I32"]),
    ],
)
def test_inspect_bad_files_exit_2(capsys, files, case, needles):
    code, out, err = _run(capsys, ["inspect", str(files[case])])
    assert code == 2, (code, err)
    _assert_one_error_line(err, *needles)


def test_inspect_good_file_exit_0(capsys, files):
    code, out, err = _run(capsys, ["inspect", str(files["good"])])
    assert code == 0, err
    assert "token_embd.weight" in out and "error" not in err


@pytest.mark.parametrize(
    "argv", [["inspect", "--no-such-option", "x.gguf"], ["no-such-command"], ["inspect"]]
)
def test_usage_errors_exit_1(capsys, argv):
    code, out, err = _run(capsys, argv)
    assert code == 1, (code, err)
    assert "Traceback" not in err and err.strip()


def _has_prefill() -> bool:
    from minfer.cli import cli

    return "prefill" in cli.commands


@pytest.mark.skipif(not _has_prefill(), reason="minfer prefill not there yet")
@pytest.mark.parametrize(
    "case,extra,needles",
    [
        ("missing", [], ["no such file"]),
        ("text", [], ["not a GGUF file"]),
        ("truncated", [], ["truncated.gguf"]),
        ("arch", [], ["unsupported architecture"]),
        ("qtype", [], ["I32"]),
        ("good", ["--prompt-file", "{bad_utf8_prompt}"], ["invalid UTF-8"]),
        ("good", ["--prompt-file", "{missing}"], ["no such prompt file"]),
    ],
)
def test_prefill_bad_input_exit_2(capsys, files, case, extra, needles):
    extra = [x.format(**{k: str(v) for k, v in files.items()}) for x in extra]
    code, out, err = _run(capsys, ["prefill", "-m", str(files[case]), "--backend", "cpu", *extra])
    assert code == 2, (code, err)
    _assert_one_error_line(err, *needles)


@pytest.mark.skipif(not _has_prefill(), reason="minfer prefill not there yet")
def test_prefill_usage_error_exit_1(capsys, files):
    code, out, err = _run(capsys, ["prefill", "-m", str(files["good"]), "--bogus"])
    assert code == 1 and "Traceback" not in err


def test_subprocess_entry_point(files):
    r = subprocess.run(
        [sys.executable, "-m", "minfer", "inspect", str(files["truncated"])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    _assert_one_error_line(r.stderr, "truncated.gguf")
    assert r.stdout == ""
