"""CPU: the input and output layer of many-prompt runs (minfer/batch/): prompt files read,
validated and tokenized in two streamed passes (errors naming their line), stdin and FIFOs
spooled, a file changed between the passes refused, and the JSONL results written atomically."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
import threading
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from minfer.batch.output import ResultWriter
from minfer.batch.prompts import Prompt, make_encoder, open_prompts
from minfer.errors import BadInput, BadModel
from minfer.text import chat

REPO = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def words(text, messages):
    """A fake tokenizer: one token per word (its length); a conversation: 100, then each
    message's words; "boom" is refused as the real encoder refuses what it cannot encode."""
    if messages is not None:
        return [100] + [len(w) for m in messages for w in m["content"].split()]
    if text == "boom":
        raise BadModel("the template does not render")
    return [len(w) for w in text.split()]


def _file(tmp_path, data, name="p.jsonl") -> str:
    p = tmp_path / name
    p.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(p)


def _all(path, fmt="jsonl", n_ctx=64, n_predict=4, enc=words):
    with open_prompts(path, fmt, enc) as src:
        counts = src.scan(n_ctx, n_predict)
        return counts, list(src)


# -- the formats --------------------------------------------------------------------------------
def test_jsonl_forms_ids_and_blank_lines(tmp_path):
    data = (
        '"one two"\n'
        "\n"
        "   \t\r\n"
        '{"prompt": "three", "id": "q-7"}\n'
        '{"messages": [{"role": "user", "content": "a bc"}], "id": 12}\n'
        '{"prompt": "x y z"}'
    )  # no final newline
    counts, ps = _all(_file(tmp_path, data))
    assert counts.dtype == np.int32 and counts.tolist() == [2, 1, 3, 3]
    assert [(p.index, p.line, p.id) for p in ps] == [
        (0, 1, 0),
        (1, 4, "q-7"),
        (2, 5, 12),
        (3, 6, 3),
    ]
    assert [p.ids.tolist() for p in ps] == [[3, 3], [5], [100, 1, 2], [1, 1, 1]]
    assert all(isinstance(p, Prompt) and p.ids.dtype == np.int32 for p in ps)
    with pytest.raises(ValueError):
        ps[0].ids[0] = 1  # read-only


def test_lines_format(tmp_path):
    counts, ps = _all(_file(tmp_path, 'one two\r\n"quoted" {x}\nlast\n', "p.txt"), "lines")
    assert counts.tolist() == [2, 2, 1]
    assert [(p.line, p.id) for p in ps] == [(1, 0), (2, 1), (3, 2)]
    got = []
    _all(
        _file(tmp_path, "a b\nc\n", "q.txt"), "lines", enc=lambda t, m: got.append(t) or words(t, m)
    )
    assert got[:2] == ["a b", "c"]  # the final newline ends the last line, nothing more


def test_utf8_bom_at_the_start_is_dropped(tmp_path):
    counts, ps = _all(_file(tmp_path, b'\xef\xbb\xbf"a b"\n'))
    assert counts.tolist() == [2]


# -- every refusal names its line ---------------------------------------------------------------
BAD_JSONL = [
    ("{bad", "invalid JSON"),
    ('"a" "b"', "invalid JSON"),
    ("42", "got a number"),
    ("[1, 2]", "got an array"),
    ("null", "got null"),
    ('{"prompt": "a", "foo": 1}', 'unknown key "foo"'),
    ('{"prompt": "a", "messages": [{"role": "user", "content": "x"}]}', "not two"),
    ('{"id": 3}', 'exactly one of "prompt", "messages", or "context" with "continuation"'),
    ('{"prompt": 3}', '"prompt" must be a string or a list of token ids, not a number'),
    ('{"prompt": "a", "id": true}', '"id" must be a string or an integer, not a boolean'),
    ('{"prompt": "a", "id": 1.5}', '"id" must be'),
    ('{"prompt": "a", "id": null}', '"id" must be'),
    ('{"prompt": "a", "id": NaN}', "NaN is not a JSON number"),
    ('{"prompt": "a", "prompt": "b"}', 'key "prompt" appears twice'),
    ('{"messages": []}', "non-empty array"),
    ('{"messages": "hi"}', "not a string"),
    ('{"messages": ["hi"]}', '"messages"[0] must be an object'),
    ('{"messages": [{"role": "user"}]}', '"messages"[0] has no "content"'),
    ('{"messages": [{"content": "x"}]}', 'has no "role"'),
    ('{"messages": [{"role": "user", "content": 5}]}', '"content" must be a string'),
    ('{"messages": [{"role": "", "content": "x"}]}', '"role" is empty'),
    ('{"messages": [{"role": "user", "content": "x", "name": "n"}]}', 'unknown key "name"'),
    ('{"messages": [{"role": "user", "content": "x"}, 7]}', '"messages"[1] must be'),
    ('""', "the prompt is empty"),
    ('"   "', "0 tokens"),
    ('"a\\u0000b"', "NUL character"),
    ('"\\ud800"', "lone surrogate \\ud800"),
    ('{"messages": [{"role": "user", "content": "\\udfff"}]}', "lone surrogate"),
    ('"boom"', "the template does not render"),
    ("[" * 100_000, "invalid JSON"),
]


@pytest.mark.parametrize("line,needle", BAD_JSONL)
def test_a_bad_jsonl_line_is_named(tmp_path, line, needle):
    path = _file(tmp_path, f'"fine"\n\n{line}\n"also fine"\n')
    with open_prompts(path, "jsonl", words) as src:
        with pytest.raises(BadInput) as e:
            src.scan(64, 4)
    msg = str(e.value)
    assert msg.startswith(f"{path} line 3: "), msg
    assert needle in msg and "\n" not in msg, msg


@pytest.mark.parametrize(
    "data,line,needle",
    [
        (b'"a"\n"b\xff"\n', 2, "invalid UTF-8 at byte offset 2 of the line (byte 0xff)"),
        (b'"a"\n"\xc3"\n', 2, "invalid UTF-8"),
        (b'"a"\n"b\x00c"\n', 2, "a NUL byte at byte offset 2"),
        (
            b'"a"\n"b"\n"' + b"w " * 40 + b'"\n',
            3,
            "prompt of 40 tokens + 4 generated tokens = 44 exceeds the context of 43",
        ),
    ],
)
def test_bytes_and_context_refusals_name_the_line(tmp_path, data, line, needle):
    path = _file(tmp_path, data)
    with open_prompts(path, "jsonl", words) as src:
        with pytest.raises(BadInput, match=None) as e:
            src.scan(43, 4)
    assert str(e.value).startswith(f"{path} line {line}: ") and needle in str(e.value), e.value


def test_a_prompt_exactly_at_the_context_passes(tmp_path):
    counts, _ = _all(_file(tmp_path, '"' + "w " * 39 + '"\n'), n_ctx=43, n_predict=4)
    assert counts.tolist() == [39]


def test_the_encoders_error_class_is_kept(tmp_path):
    with open_prompts(_file(tmp_path, '"boom"\n'), "jsonl", words) as src:
        with pytest.raises(BadModel, match=r"line 1: the template does not render"):
            src.scan(64, 0)


def test_a_line_over_the_byte_cap(tmp_path):
    big = '"' + "a" * (1 << 20) + '"'  # 1 MiB + 2 bytes: over the 1 MiB floor of a small context
    path = _file(tmp_path, f'"ok"\n{big}\n')
    with open_prompts(path, "jsonl", words) as src:
        with pytest.raises(BadInput, match=r"line 2: longer than 1,048,576 bytes, the cap"):
            src.scan(4096, 0)
    # a context of 128k tokens allows 2 MiB a line
    counts, _ = _all(path, n_ctx=131072)
    assert counts.tolist() == [1, 1]


def test_a_100_mb_line_is_never_in_memory(tmp_path):
    p = tmp_path / "huge.jsonl"
    with open(p, "wb") as f:
        f.write(b'"ok"\n"')
        f.truncate(100 << 20)  # sparse: a 100 MB second line
    tracemalloc.start()
    try:
        with open_prompts(str(p), "jsonl", words) as src:
            with pytest.raises(BadInput, match="line 2: longer than"):
                src.scan(8192, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


@pytest.mark.parametrize(
    "data,line,needle",
    [
        ("a\n\nb\n", 2, "an empty line is an empty prompt"),
        ("a\nb\n\n", 3, "an empty line"),
        ("a\n\r\n", 2, "an empty line"),
        ("a\n   \n", 2, "0 tokens"),
    ],
)
def test_lines_format_refusals(tmp_path, data, line, needle):
    path = _file(tmp_path, data, "p.txt")
    with open_prompts(path, "lines", words) as src:
        with pytest.raises(BadInput) as e:
            src.scan(64, 0)
    assert str(e.value).startswith(f"{path} line {line}: ") and needle in str(e.value), e.value


@pytest.mark.parametrize(
    "data,fmt,needle",
    [
        ("", "jsonl", "no prompts in the file (it is empty)"),
        ("", "lines", "no prompts in the file (it is empty)"),
        ("\n  \n\r\n", "jsonl", "no prompts in the file (only blank lines)"),
    ],
)
def test_no_prompts(tmp_path, data, fmt, needle):
    path = _file(tmp_path, data)
    with open_prompts(path, fmt, words) as src:
        with pytest.raises(BadInput, match="^" + re.escape(path) + ": no prompts"):
            src.scan(64, 0)
        with pytest.raises(BadInput) as e:
            src.scan(64, 0)
    assert needle in str(e.value)


def test_bad_format_and_paths(tmp_path):
    with pytest.raises(BadInput, match=r"--prompts-format 'csv': not a prompt file format"):
        open_prompts(_file(tmp_path, '"a"\n'), "csv", words)
    with pytest.raises(BadInput, match="no such prompt file"):
        open_prompts(str(tmp_path / "missing.jsonl"), "jsonl", words)
    with pytest.raises(BadInput, match="is a directory, not a prompt file"):
        open_prompts(str(tmp_path), "jsonl", words)
    with pytest.raises(BadInput, match="character device"):
        open_prompts("/dev/zero", "jsonl", words)


def test_iterating_before_scan_is_a_bug(tmp_path):
    src = open_prompts(_file(tmp_path, "a\n"), "lines", words)
    with src, pytest.raises(RuntimeError, match="scan"):
        iter(src)


# -- stdin and FIFOs are spooled -----------------------------------------------------------------
def test_stdin_is_spooled_to_a_private_file(tmp_path, monkeypatch):
    data = '"a b"\n{"prompt": "c", "id": "z"}\n'
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data.encode())))
    spool_dir = tmp_path / "tmp"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    src = open_prompts("-", "jsonl", words)
    assert sys.stdin.buffer.read() == b""  # read to its end at open
    assert list(spool_dir.iterdir()) == []  # the spool has no name: nothing left behind
    with src:
        assert src.scan(64, 0).tolist() == [2, 1]
        assert [(p.id, p.ids.tolist()) for p in src] == [(0, [1, 1]), ("z", [1])]
        assert [p.id for p in src] == [0, "z"]  # again, from the same bytes
    assert src._reader.f.closed


def test_stdin_errors_say_stdin(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'"a"\n{x\n')))
    with open_prompts("-", "jsonl", words) as src:
        with pytest.raises(BadInput, match=r"^stdin line 2: invalid JSON"):
            src.scan(64, 0)


def test_a_fifo_is_spooled(tmp_path):
    fifo = tmp_path / "prompts.fifo"
    os.mkfifo(fifo)
    data = "".join(f'{{"prompt": "w{i} x", "id": {i}}}\n' for i in range(5000)).encode()

    def feed():
        with open(fifo, "wb") as f:
            f.write(data)

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    with open_prompts(str(fifo), "jsonl", words) as src:
        t.join(10)
        assert not t.is_alive()
        assert src.scan(64, 0).tolist() == [2] * 5000
        assert [p.id for p in src] == list(range(5000))


# -- a file that changes between the passes ------------------------------------------------------
def _rewrite(path, old, new, keep_mtime):
    st = os.stat(path)
    data = Path(path).read_bytes()
    assert data.count(old) == 1
    with open(path, "r+b") as f:  # in place: the open file sees it
        f.write(data.replace(old, new))
        f.truncate()
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize(
    "old,new,keep_mtime",
    [
        (b'"c d"', b'"c d e"', False),  # longer
        (b'"c d"', b'"c dd"', True),  # same size, same mtime, a byte differs
        (b'"c d"', b'"x y"', True),  # same token count, other text
        (b"   ", b'"x"', True),  # a blank line became a prompt
    ],
)
def test_a_file_changed_between_passes_is_refused(tmp_path, old, new, keep_mtime):
    path = _file(tmp_path, '"a b"\n   \n"c d"\n"e"\n')
    with open_prompts(path, "jsonl", words) as src:
        src.scan(64, 0)
        _rewrite(path, old, new, keep_mtime)
        with pytest.raises(BadInput, match="changed while it was read") as e:
            list(src)
    assert str(e.value).startswith(f"{path}: ") and "\n" not in str(e.value)


def test_a_file_replaced_by_rename_is_read_as_it_was(tmp_path):
    path = _file(tmp_path, '"a b"\n"c"\n')
    with open_prompts(path, "jsonl", words) as src:
        src.scan(64, 0)
        other = _file(tmp_path, '"x y z"\n', "other.jsonl")
        os.replace(other, path)
        assert [p.ids.tolist() for p in src] == [[1, 1], [1]]  # the open file, unchanged


def test_a_changed_token_count_is_refused(tmp_path):
    """The bytes stay, the encoder does not (a tokenizer swapped between the passes)."""
    calls = []

    def drifting(text, messages):
        calls.append(text)
        return words(text, messages) * (2 if len(calls) > 2 else 1)

    with open_prompts(_file(tmp_path, '"a"\n"b"\n'), "jsonl", drifting) as src:
        src.scan(64, 0)
        with pytest.raises(BadInput, match="changed while it was read"):
            list(src)


# -- many prompts --------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jsonl", "lines"])
def test_ten_thousand_tiny_prompts(tmp_path, fmt):
    n = 10_000
    lines = [f"p{i}" + " x" * (i % 5) for i in range(n)]
    data = "".join((json.dumps(s) if fmt == "jsonl" else s) + "\n" for s in lines)
    tracemalloc.start()
    try:
        with open_prompts(_file(tmp_path, data), fmt, words) as src:
            counts = src.scan(64, 8)
            k = 0
            for p in src:
                assert p.index == k and p.line == k + 1 and p.id == k
                assert p.ids.size == counts[k] == 1 + k % 5
                k += 1
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert k == n and counts.shape == (n,) and int(counts.sum()) == n + 2 * n
    assert peak < 4 << 20, peak  # a line at a time, 12 bytes a prompt kept


# -- the encoder: plain text, chat, messages ----------------------------------------------------
class _CharTok:
    """A fake tokenizer: one id per character (ord), enough for chat.render/encode_messages."""

    bos_id, eos_id, add_bos = 1, 2, False
    texts = {1: "<s>", 2: "</s>"}

    def token_text(self, i):
        return self.texts[i]

    def encode(self, text, add_bos=None, parse_special=False, add_eos=None):
        assert parse_special in (True, False)
        return [ord(c) for c in text]


TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def _decode(ids):
    return "".join(map(chr, ids))


def test_make_encoder_text_and_messages():
    meta, tok = {chat.TEMPLATE_KEY: TEMPLATE}, _CharTok()
    plain = make_encoder(meta, tok, None, None, True)
    assert _decode(plain("hi", None)) == "hi"
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    assert _decode(plain(None, msgs)) == "<system>s<user>q<assistant>"
    # a conversation ending with the assistant's answer stands as it is (to be scored)
    answered = msgs + [{"role": "assistant", "content": "a"}]
    assert _decode(plain(None, answered)) == "<system>s<user>q<assistant>a"
    as_chat = make_encoder(meta, tok, True, None, True)
    assert _decode(as_chat("hi", None)) == "<user>hi<assistant>"
    # --system implies the template for text, and goes first in a conversation without one
    sys_enc = make_encoder(meta, tok, None, "be brief", True)
    assert _decode(sys_enc("hi", None)) == "<system>be brief<user>hi<assistant>"
    assert _decode(sys_enc(None, msgs[1:])) == "<system>be brief<user>q<assistant>"
    assert _decode(sys_enc(None, msgs)) == "<system>s<user>q<assistant>"
    with pytest.raises(TypeError):
        plain("a", msgs)


def test_make_encoder_without_a_template(tmp_path):
    tok = _CharTok()
    with pytest.raises(BadInput, match="--chat: this model has no tokenizer.chat_template"):
        make_encoder({}, tok, True, None, True)
    with pytest.raises(BadInput, match="--system goes with --chat"):
        make_encoder({}, tok, False, "s", True)
    enc = make_encoder({}, tok, None, None, True)
    path = _file(tmp_path, '"fine"\n{"messages": [{"role": "user", "content": "x"}]}\n')
    with open_prompts(path, "jsonl", enc) as src:
        with pytest.raises(
            BadInput,
            match=r'line 2: a "messages" prompt needs the model\'s '
            r"chat template",
        ):
            src.scan(64, 0)


def test_a_template_refusal_names_the_line(tmp_path):
    meta = {
        chat.TEMPLATE_KEY: "{% if messages[0].role == 'tool' %}"
        "{{ raise_exception('no tools') }}{% endif %}x"
    }
    enc = make_encoder(meta, _CharTok(), None, None, True)
    path = _file(tmp_path, '"a"\n{"messages": [{"role": "tool", "content": "x"}]}\n')
    with open_prompts(path, "jsonl", enc) as src:
        with pytest.raises(
            BadInput,
            match=r'line 2: "messages": the model\'s chat template '
            r"refused the messages: no tools",
        ):
            src.scan(64, 0)


@pytest.fixture(scope="module")
def real():
    if not DEFAULT_MODEL.is_file():
        pytest.skip(f"{DEFAULT_MODEL.name} not in models/ (minfer prefill fetches it)")
    from minfer.gguf.loader import load_model
    from minfer.text.tokenizer import Tokenizer

    model = load_model(DEFAULT_MODEL)
    return SimpleNamespace(
        meta=model.metadata, tok=Tokenizer.from_metadata(model.metadata), n_ctx=model.config.n_ctx
    )


def test_the_default_models_tokenizer_and_template(tmp_path, real):
    meta, tok = real.meta, real.tok
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    data = "".join(
        json.dumps(x, ensure_ascii=False) + "\n"
        for x in [
            "The capital of France is",
            {"prompt": "<|im_start|>é", "id": "s"},
            {"messages": conv, "id": 7},
        ]
    )
    for special in (True, False):
        enc = make_encoder(meta, tok, None, None, special)
        counts, ps = _all(_file(tmp_path, data), n_ctx=real.n_ctx, n_predict=32, enc=enc)
        want = [
            tok.encode("The capital of France is", parse_special=special),
            tok.encode("<|im_start|>é", parse_special=special),
            chat.encode_messages(meta, tok, conv, special),
        ]
        assert [p.ids.tolist() for p in ps] == want and counts.tolist() == list(map(len, want))
        assert [p.id for p in ps] == [0, "s", 7]
    text = tok.decode(ps[2].ids, special=True)
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n")
    assert text.endswith("What is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    # the one-turn conversation equals `minfer prefill --chat -p` of its text
    enc = make_encoder(meta, tok, None, None, True)
    assert enc(None, [{"role": "user", "content": "hi"}]) == chat.encode(meta, tok, "hi")
    assert make_encoder(meta, tok, True, None, True)("hi", None) == chat.encode(meta, tok, "hi")


# -- the writer ---------------------------------------------------------------------------------
RECORDS = [{"id": 0, "text": "Paris é ✓", "greedy_ids": [1, 2]}, {"id": "b", "n": None}]


def _expected():
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in RECORDS)


def test_writer_file_is_renamed_into_place_at_commit(tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    with ResultWriter(str(out)) as w:
        w.write(RECORDS[0])
        tmp = [p.name for p in tmp_path.iterdir()]
        assert not out.exists() and tmp == [f".out.jsonl.tmp-{os.getpid()}"]
        w.write(RECORDS[1])
        w.commit()
        assert out.read_text(encoding="utf-8") == _expected()
        with pytest.raises(RuntimeError):
            w.write({})
    assert synced and "✓" in out.read_bytes().decode("utf-8")  # raw UTF-8, not \u2713
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


@pytest.mark.parametrize("existing", [None, "old results\n"])
def test_writer_exception_midway_leaves_nothing_and_keeps_the_old_file(tmp_path, existing):
    out = tmp_path / "out.jsonl"
    if existing is not None:
        out.write_text(existing)
    with pytest.raises(KeyError):
        with ResultWriter(str(out)) as w:
            w.write(RECORDS[0])
            raise KeyError("the run failed")
    assert (out.read_text() if out.exists() else None) == existing
    assert [p.name for p in tmp_path.iterdir()] == ([] if existing is None else ["out.jsonl"])
    # leaving without commit() is the same
    with ResultWriter(str(out)) as w:
        w.write(RECORDS[0])
    assert (out.read_text() if out.exists() else None) == existing
    assert len(list(tmp_path.iterdir())) == (0 if existing is None else 1)


def test_writer_refuses_bad_outputs_up_front(tmp_path):
    with pytest.raises(BadInput, match="is a directory; refusing to replace it"):
        ResultWriter(str(tmp_path))
    with pytest.raises(BadInput, match="no such directory"):
        ResultWriter(str(tmp_path / "missing" / "out.jsonl"))
    assert list(tmp_path.iterdir()) == []


def test_writer_writes_through_dev_null():
    with ResultWriter("/dev/null") as w:  # written through (no fsync there: EINVAL)
        w.write(RECORDS[0])
        w.commit()
    assert os.path.exists("/dev/null") and not os.path.isfile("/dev/null")


@pytest.mark.parametrize("path", [None, "-"])
def test_writer_stdout_is_jsonl_line_by_line(capsys, path):
    print("before")
    with ResultWriter(path) as w:
        w.write(RECORDS[0])
        assert (
            capsys.readouterr().out
            == "before\n" + json.dumps(RECORDS[0], ensure_ascii=False) + "\n"
        )
        w.write(RECORDS[1])
        w.commit()
    out = capsys.readouterr().out
    assert out == json.dumps(RECORDS[1], ensure_ascii=False) + "\n"
    assert [json.loads(x) for x in out.splitlines()] == RECORDS[1:]
