"""Prompt-file fuzzing (issue 36, item 6): seeded mutations of small prompt files, run through the
in-process CLI (`minfer prefill --prompts F --backend cpu -m tiny -n 1 -o OUT`) and, many more,
through open_prompts(...).scan() and the second pass directly.

Each case is a valid file of 1 to 4 short prompts (jsonl: strings, {"prompt"}, {"messages"},
with or without "id"; or `--prompts-format lines`), then 1 to 3 mutations: a bit flip, a
truncation, an inserted NUL byte, invalid UTF-8, a BOM, a \\u0000 or lone-surrogate escape,
a huge number, deep nesting, a duplicate key, a wrong type, an unknown key, blank lines, CRLF,
two lines joined, a line repeated, a span deleted, random bytes.

An oracle written from docs/batch.md ("Prompt files": what is refused), not from
minfer/batch/prompts.py, says what each file must give: its records (id and token count per
prompt line; the tokenizer and the chat template are the real ones), the first bad line, or
"no prompts". Every case must match it:
- accepted: exit 0, OUT holds exactly one valid JSON record per prompt line, in order, with the
  expected id and n_prompt, and no non-finite number (NaN / Infinity); nothing else in OUT's
  folder (no temporary file);
- refused: exit 2, exactly one `error:` line on stderr, naming the first bad line's number (or
  "no prompts" for a file without one), OUT's folder empty (OUT never written, no temp file);
- never a Python traceback, never an exception other than BadInput out of scan().

The tiny model gets a small chat template (patched into its metadata: the synthetic model has
none) so "messages" lines render. MINFER_FUZZ_PROMPTS scales the case counts (default 1).
"""

from __future__ import annotations

import collections
import json
import math
import os
import random
import re
import time
import traceback

import pytest
from cli_inproc import error_lines, run_cli

SCALE = float(os.environ.get("MINFER_FUZZ_PROMPTS", "1"))
N_CLI = int(1200 * SCALE)  # through minfer.cli.main
N_SCAN = int(4000 * SCALE)  # through open_prompts().scan() + iteration
N_CTX = 128  # small: a long prompt past the context is reachable
N_PREDICT = 1
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


# -- the model: tiny, with a chat template ---------------------------------------------------------
@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("fuzzp"), seed=5, vocab=512, n_ctx=N_CTX)


@pytest.fixture(scope="module")
def chat_model(tiny):
    from minfer.gguf.loader import load_model

    m = load_model(str(tiny))
    m.metadata["tokenizer.chat_template"] = TEMPLATE
    return m


@pytest.fixture
def patched(monkeypatch, tiny, chat_model):
    """The CLI's load_model gives the templated tiny model for its path (and saves reloading)."""
    import minfer.gguf.loader

    real = minfer.gguf.loader.load_model
    monkeypatch.setattr(
        minfer.gguf.loader,
        "load_model",
        lambda p, *a, **k: chat_model if str(p) == str(tiny) else real(p, *a, **k),
    )
    return tiny


@pytest.fixture(scope="module")
def encode(chat_model):
    from minfer.batch.prompts import make_encoder
    from minfer.text.tokenizer import Tokenizer

    tok = Tokenizer.from_metadata(chat_model.metadata)
    return make_encoder(chat_model.metadata, tok, None, None, True)


# -- valid files -----------------------------------------------------------------------------------
TEXTS = [
    "a",
    "hi",
    "x y",
    "é",
    "✓ ok",
    "<s>",
    "tab\there",
    "q\nq",
    'say "z"',
    "  sp",
    "日本",
    "\U0001f600",
    "\\",
    "0",
]
ROLES = ["user", "system", "assistant", "tool", "u"]


def _jstr(rng, s) -> str:
    return json.dumps(s, ensure_ascii=rng.random() < 0.5)


def _valid_line(rng: random.Random) -> str:
    t = rng.choice(TEXTS)
    k = rng.randrange(6)
    if k == 0:
        return _jstr(rng, t)
    if k == 1:
        return "{" + f'"prompt": {_jstr(rng, t)}' + "}"
    pid = rng.choice([rng.randrange(-5, 100), f"id-{rng.randrange(100)}", "", "é", 0])
    if k == 2:
        return json.dumps({"prompt": t, "id": pid}, ensure_ascii=rng.random() < 0.5)
    if k == 3:
        return json.dumps({"id": pid, "prompt": t}, separators=(",", ":"))
    msgs = [
        {"role": rng.choice(ROLES), "content": rng.choice(TEXTS)}
        for _ in range(rng.randrange(1, 4))
    ]
    d = {"messages": msgs}
    if k == 5:
        d["id"] = pid
    return json.dumps(d, ensure_ascii=rng.random() < 0.5)


def _valid_text_line(rng: random.Random) -> str:
    return rng.choice(
        [
            "hello",
            "é ✓",
            'quoted "x"',
            "{not json}",
            "[1, 2]",
            "a\tb",
            " lead",
            "null",
            "\U0001f600 end",
        ]
    )


# -- mutations -------------------------------------------------------------------------------------
HUGE = [
    "18446744073709551616",
    "-9223372036854775809",
    "1" + "0" * 308,
    "9" * 4300,
    "9" * 4301,
    "1" * 6000,
    "1e400",
    "-1e400",
    "1e308",
    "1.5",
    "1E5",
    "-0",
    "0.0",
    "123456789012345678901234567890",
]
BAD_LINES = [
    '{"prompt": 1}',
    '{"prompt": []}',
    '{"prompt": {}}',
    '{"prompt": null}',
    '{"prompt": true}',
    '{"messages": "x"}',
    '{"messages": []}',
    '{"messages": [1]}',
    '{"messages": [{}]}',
    '{"messages": [{"role": 1, "content": "c"}]}',
    '{"messages": [{"role": "u", "content": null}]}',
    '{"messages": [{"role": "", "content": "c"}]}',
    '{"messages": [{"role": "u", "content": "c", "x": 1}]}',
    '{"prompt": "a", "id": true}',
    '{"prompt": "a", "id": null}',
    '{"prompt": "a", "id": []}',
    '{"prompt": "a", "id": {}}',
    '{"prompt": "a", "id": 1.0}',
    '{"prompt": "a", "prompt": "b"}',
    '{"id": 1, "prompt": "a", "id": 2}',
    '{"messages": [{"role": "u", "role": "v", "content": "c"}]}',
    '{"prompt": "a", "messages": [{"role": "u", "content": "c"}]}',
    '{"id": 3}',
    "{}",
    '{"promt": "a"}',
    '{"prompt": "a", "": 1}',
    "42",
    "null",
    "true",
    "[]",
    '["a"]',
    '""',
    '{"prompt": ""}',
    "NaN",
    "-Infinity",
    '{"prompt": "a", "id": NaN}',
    '{"prompt": "a", "id": Infinity}',
    '"a\\u0000b"',
    '{"prompt": "a", "id": "\\u0000"}',
    '"\\ud800"',
    '"x\\udfffy"',
    '{"prompt": "a", "id": "\\ud83d"}',
    '{"messages": [{"role": "u\\u0000", "content": "c"}]}',
    '{"messages": [{"role": "u", "content": "\\udc00"}]}',
    '"tab\there"',
    '"a\x01"',
    '"a" "b"',
    '"a",',
    "{'prompt': 'a'}",
    '{"prompt": "a"} x',
    '"' + "w" * 150 + '"',
    '{"prompt": "' + "w " * 70 + '"}',
    '\ufeff"bom"',
    '"\\x41"',
    '"\\u12"',
]
INVALID_UTF8 = [
    b"\xff",
    b"\xfe",
    b"\xc3",
    b"\xc3\x28",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xc0\xaf",
    b"\xf4\x90\x80\x80",
    b"\x80",
]
BLANKS = ["", " ", "\t", "\r", "  \r", " \t "]


def _nested(rng) -> str:
    d = rng.choice([3, 40, 1000, 20_000, 100_000])
    k = rng.randrange(4)
    if k == 0:
        return "[" * d + "]" * d
    if k == 1:
        return "[" * d
    if k == 2:
        return '{"prompt": "a", "id": ' + "[" * d + "]" * d + "}"
    return '{"a":' * d + "1" + "}" * d


def _line_mutation(rng, lines: list[str], fmt: str) -> str:
    """Structured: edit the list of lines (before they are bytes); -> its name."""
    if not lines:
        lines.append(rng.choice(BLANKS))
        return "blank-line"
    i = rng.randrange(len(lines))
    k = rng.randrange(11)
    if k == 9 and fmt == "jsonl" and lines[i].startswith("{"):
        try:  # a key of the object given twice (the same or another value)
            key, val = rng.choice(list(json.loads(lines[i]).items()))
        except (ValueError, RecursionError, AttributeError, IndexError):
            pass
        else:
            val = val if rng.random() < 0.5 else "other"
            lines[i] = "{" + f"{json.dumps(key)}: {json.dumps(val)}, " + lines[i][1:]
            return "duplicate-key"
    if k in (0, 10) and fmt == "jsonl":
        lines[i : i + 1] = [rng.choice(BAD_LINES)]
        return "bad-line"
    if k == 1 and fmt == "jsonl":
        tpl = rng.choice(
            [
                '{"prompt": "a", "id": %s}',
                '{"id": %s, "prompt": "b"}',
                "%s",
                '{"prompt": %s}',
                '{"messages": [{"role": "u", "content": %s}]}',
            ]
        )
        lines[i : i + 1] = [tpl % rng.choice(HUGE)]
        return "huge-number"
    if k == 2 and fmt == "jsonl":
        lines[i : i + 1] = [_nested(rng)]
        return "deep-nesting"
    if k == 3:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(BLANKS))
        return "blank-line"
    if k == 4:
        for j in range(len(lines)):
            if rng.random() < 0.7:
                lines[j] += "\r"
        return "crlf"
    if k == 5 and len(lines) > 1:
        j = rng.randrange(len(lines) - 1)
        lines[j : j + 2] = [lines[j] + rng.choice(["", " ", ","]) + lines[j + 1]]
        return "join-lines"
    if k == 6:
        lines.insert(i, lines[i])
        return "repeat-line"
    if k == 7:
        s = lines[i]
        p = rng.randrange(len(s) + 1)
        lines[i] = (
            s[:p]
            + rng.choice(
                [
                    "\\u0000",
                    "\\ud800",
                    "\\udbff\\udfff",
                    "\\uDC00",
                    "\x00",
                    "\x1f",
                    '"',
                    "\\",
                    "}",
                    ",",
                    ":",
                    "\u2028",
                    "\ufeff",
                    "\\n",
                ]
            )
            + s[p:]
        )
        return "insert-escape"
    if fmt == "jsonl":  # a valid line's value of the wrong type, or an unknown key
        wrong = rng.choice(["1", "[]", "{}", "null", "false", "-1.5e3", '"s"'])
        key = rng.choice(["prompt", "id", "messages", "role", "content", "extra", "PROMPT"])
        s = lines[i]
        m = re.search(f'"{key}"\\s*:\\s*', s)
        if m:
            lines[i] = s[: m.end()] + wrong + _skip_value(s, m.end())
        else:
            lines[i] = s.rstrip("}") + f', "{key}": {wrong}' + "}" if s.startswith("{") else s
        return "wrong-type"
    lines.append(_valid_line(rng) if fmt == "jsonl" else _valid_text_line(rng))
    return "valid-more"


def _skip_value(s: str, at: int) -> str:
    """s after the JSON value starting at `at` (the rest of the line, best effort)."""
    try:
        _, end = json.JSONDecoder().raw_decode(s, at)
        return s[end:]
    except (ValueError, RecursionError):
        return s[at + 1 :]


def _byte_mutation(rng, data: bytearray) -> str:
    n = len(data)
    k = rng.randrange(7)
    if k == 0 and n:
        data[rng.randrange(n)] ^= 1 << rng.randrange(8)
        return "bit-flip"
    if k == 1 and n:
        del data[rng.randrange(n) :]
        return "truncate"
    if k == 2:
        p = rng.randrange(n + 1)
        data[p:p] = b"\x00"
        return "nul-byte"
    if k == 3:
        p = rng.randrange(n + 1)
        data[p:p] = rng.choice(INVALID_UTF8)
        return "invalid-utf8"
    if k == 4:
        p = 0 if rng.random() < 0.6 else rng.randrange(n + 1)
        data[p:p] = b"\xef\xbb\xbf"
        return "bom"
    if k == 5 and n:
        p = rng.randrange(n)
        del data[p : p + rng.randrange(1, 8)]
        return "delete-span"
    p = rng.randrange(n + 1)
    data[p:p] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
    return "random-bytes"


def make_case(seed: int) -> tuple[bytes, str, list[str]]:
    """(file bytes, format, mutation names) of case `seed`."""
    rng = random.Random(seed)
    fmt = "lines" if rng.random() < 0.15 else "jsonl"
    gen = _valid_line if fmt == "jsonl" else _valid_text_line
    lines = [gen(rng) for _ in range(rng.randrange(1, 5))]
    if rng.random() < 0.02:  # no prompt at all: empty, or blank lines only
        lines = [rng.choice(BLANKS) for _ in range(rng.randrange(3))]
    ops = []
    r = rng.random()
    n_line, n_byte = (
        (0, 0)
        if r < 0.08
        else (rng.choice((1, 1, 2, 3)), 0)
        if r < 0.6
        else (rng.choice((0, 1)), rng.choice((1, 1, 2)))
    )
    for _ in range(n_line):
        ops.append(_line_mutation(rng, lines, fmt))
    data = bytearray("\n".join(lines).encode("utf-8", "surrogatepass"))
    if rng.random() < 0.8:
        data += b"\n"
    for _ in range(n_byte):
        ops.append(_byte_mutation(rng, data))
    return bytes(data), fmt, ops or ["none"]


# -- the oracle (docs/batch.md, "Prompt files") ----------------------------------------------------
class _Bad(Exception):
    pass


def _pairs(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Bad("duplicate key")
    return dict(pairs)


def _const(name):
    raise _Bad(name)


def _clean(s: str) -> bool:
    """No NUL, no lone surrogate (writable as UTF-8)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in s


def _oracle_value(s: str):
    """(id or None, text, messages) of a jsonl line; _Bad if the docs say it is refused."""
    try:
        v = json.loads(s, object_pairs_hook=_pairs, parse_constant=_const)
    except (ValueError, RecursionError):
        raise _Bad("json") from None
    if isinstance(v, str):
        v = {"prompt": v}
    if type(v) is not dict or set(v) - {"prompt", "messages", "id"}:
        raise _Bad("shape")
    if ("prompt" in v) == ("messages" in v):
        raise _Bad("one of")
    pid = v.get("id")
    if "id" in v and type(pid) not in (int, str) or type(pid) is str and not _clean(pid):
        raise _Bad("id")
    if "prompt" in v:
        t = v["prompt"]
        if type(t) is not str or not t or not _clean(t):
            raise _Bad("prompt")
        return pid, t, None
    ms = v["messages"]
    if type(ms) is not list or not ms:
        raise _Bad("messages")
    for m in ms:
        if type(m) is not dict or set(m) != {"role", "content"}:
            raise _Bad("message")
        if any(type(m[k]) is not str or not _clean(m[k]) for k in m) or not m["role"]:
            raise _Bad("message")
    return pid, None, ms


def oracle(data: bytes, fmt: str, encode):
    """("ok", [(id, n_tokens)...]) | ("bad", line number) | ("empty", None)."""
    from minfer.errors import BadInput

    pieces = data.split(b"\n")
    if data.endswith(b"\n") or not data:
        pieces.pop()
    if pieces and pieces[0].startswith(b"\xef\xbb\xbf"):
        pieces[0] = pieces[0][3:]
    out = []
    for n, raw in enumerate(pieces, 1):
        try:
            if b"\x00" in raw:
                raise _Bad("nul")
            if fmt == "jsonl" and not raw.strip(b" \t\r"):
                continue
            try:
                s = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _Bad("utf-8") from None
            if fmt == "lines":
                s = s[:-1] if s.endswith("\r") else s
                if not s:
                    raise _Bad("empty")
                pid, text, msgs = None, s, None
            else:
                pid, text, msgs = _oracle_value(s)
            try:
                ids = encode(text, msgs)
            except BadInput:
                raise _Bad("encode") from None
            if not len(ids) or len(ids) + N_PREDICT > N_CTX:
                raise _Bad("tokens")
        except _Bad:
            return "bad", n
        out.append((len(out) if pid is None else pid, len(ids)))
    return ("ok", out) if out else ("empty", None)


# -- checks ----------------------------------------------------------------------------------------
def _no_constant(name):
    raise ValueError(f"non-finite number {name} in the output")


def _finite(x) -> bool:
    if isinstance(x, float):
        return math.isfinite(x)
    if isinstance(x, list):
        return all(map(_finite, x))
    if isinstance(x, dict):
        return all(map(_finite, x.values()))
    return True


def _category(msg: str) -> str:
    """A refusal's kind, for the outcome table: the message past `line N: `, shortened."""
    m = re.search(r"line \d+: (.*)", msg)
    s = m.group(1) if m else msg.split(": ", 2)[-1]
    for pat, name in [
        (r"^invalid JSON \(key .* twice", "duplicate key"),
        (r"^invalid JSON \(nested", "nested too deeply"),
        (r"^invalid JSON \(Exceeds the limit", "integer too long"),
        (r"^invalid JSON \(\w+ is not a JSON number", "NaN/Infinity"),
        (r"^invalid JSON", "invalid JSON"),
        (r"^invalid UTF-8", "invalid UTF-8"),
        (r"NUL", "NUL"),
        (r"lone surrogate", "lone surrogate"),
        (r"^unknown key", "unknown key"),
        (r"^expected a JSON string", "wrong type"),
        (r"must be", "wrong type"),
        (r"exactly one of", "prompt xor messages"),
        (r"^\"messages\"", "bad messages"),
        (r"has no", "bad messages"),
        (r"is empty|empty prompt", "empty prompt"),
        (r"exceeds the context", "past the context"),
        (r"no prompts", "no prompts"),
    ]:
        if re.search(pat, s):
            return name
    return s[:40]


def _check_cli(case: int, data: bytes, fmt: str, want, folder, tiny, rng) -> str:
    """Run one case through the CLI; an outcome name, AssertionError on a mismatch."""
    src = folder / "in" / "p.txt"
    outdir = folder / "out"
    src.write_bytes(data)
    out = outdir / "r.jsonl"
    logprobs = rng.random() < 0.3
    args = (
        [
            "prefill",
            "--prompts",
            str(src),
            "--backend",
            "cpu",
            "-m",
            str(tiny),
            "-n",
            str(N_PREDICT),
            "-o",
            str(out),
        ]
        + (["--prompts-format", "lines"] if fmt == "lines" else [])
        + (["--logprobs"] if logprobs else [])
    )
    code, stdout, stderr = run_cli(args)
    assert "Traceback" not in stderr, stderr
    left = sorted(p.name for p in outdir.iterdir())
    errs = error_lines(stderr)
    kind, detail = want
    if kind == "ok":
        assert code == 0 and not errs, (code, stderr[-800:])
        assert left == ["r.jsonl"], left  # no temporary file beside it
        text = out.read_bytes().decode("utf-8")
        assert text.endswith("\n") or not text
        lines = text.split("\n")[:-1]
        assert text.splitlines() == lines  # no raw U+2028 & co. a reader could split at
        recs = [json.loads(x, parse_constant=_no_constant) for x in lines]
        assert len(recs) == len(detail), (len(recs), detail)
        for r, (pid, n) in zip(recs, detail):
            assert r["id"] == pid and type(r["id"]) is type(pid), (r, pid)
            assert r["n_prompt"] == n and len(r["greedy_ids"]) == N_PREDICT, (r, n)
            assert _finite(r)
            if logprobs:
                assert len(r["logprobs"]) == n - 1 and math.isfinite(r["logprob_sum"])
        out.unlink()
        return "ok"
    assert code == 2, (code, stderr[-800:])
    assert len(errs) == 1, stderr[-800:]
    assert left == [], left  # OUT never written, no temporary file left
    if kind == "bad":
        assert f"{src} line {detail}: " in errs[0], (detail, errs[0])
    else:
        assert "no prompts in the file" in errs[0], errs[0]
    return _category(errs[0])


def _check_scan(data: bytes, fmt: str, want, path, encode) -> str:
    from minfer.batch.prompts import open_prompts
    from minfer.errors import BadInput

    path.write_bytes(data)
    kind, detail = want
    try:
        with open_prompts(str(path), fmt, encode) as src:
            counts = src.scan(N_CTX, N_PREDICT)
            got = [(p.id, p.ids.size) for p in src]
    except BadInput as e:
        msg = str(e)
        assert "\n" not in msg, msg
        if kind == "bad":
            assert msg.startswith(f"{path} line {detail}: "), (detail, msg)
        else:
            assert kind == "empty" and "no prompts in the file" in msg, (want, msg)
        return _category(msg)
    assert kind == "ok", (want, got)
    assert counts.tolist() == [n for _, n in got] and got == detail, (got, detail)
    return "ok"


def _table(title: str, outcomes: collections.Counter, total: int, secs: float) -> str:
    rows = "\n".join(f"  {v:6d}  {k}" for k, v in outcomes.most_common())
    return f"{title}: {total} cases in {secs:.1f} s\n{rows}"


def _run_cases(seeds, check) -> tuple[collections.Counter, collections.Counter, list]:
    outcomes, ops_seen, failures = collections.Counter(), collections.Counter(), []
    for seed in seeds:
        data, fmt, ops = make_case(seed)
        ops_seen.update(ops)
        try:
            outcomes[check(seed, data, fmt)] += 1
        except Exception as e:  # noqa: BLE001 - collected, reported with the case's bytes
            tb = "".join(traceback.format_exception(e)[-4:])
            failures.append(f"seed {seed} fmt {fmt} ops {ops} data {data[:300]!r}\n{tb}")
    return outcomes, ops_seen, failures


# -- the tests -------------------------------------------------------------------------------------
def test_fuzz_prompt_files_through_the_cli(tmp_path, patched, encode, report):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    t0 = time.perf_counter()

    def check(seed, data, fmt):
        want = oracle(data, fmt, encode)
        return _check_cli(seed, data, fmt, want, tmp_path, patched, random.Random(~seed))

    outcomes, ops, failures = _run_cases(range(N_CLI), check)
    secs = time.perf_counter() - t0
    print("\n" + _table("prompt fuzz, CLI", outcomes, N_CLI, secs))
    print("mutations applied: " + ", ".join(f"{k} {v}" for k, v in ops.most_common()))
    report(
        f"prompt fuzz (CLI): {N_CLI} cases in {secs:.1f} s, "
        f"{outcomes['ok']} accepted, {N_CLI - outcomes['ok']} refused; "
        + ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
    )
    assert not failures, f"{len(failures)} failing cases, first:\n" + "\n".join(failures[:5])
    assert outcomes["ok"] >= N_CLI // 10 and N_CLI - outcomes["ok"] >= N_CLI // 3  # both paths


def test_fuzz_prompt_files_scan(tmp_path, encode, report):
    t0 = time.perf_counter()
    path = tmp_path / "p.jsonl"

    def check(seed, data, fmt):
        return _check_scan(data, fmt, oracle(data, fmt, encode), path, encode)

    outcomes, _, failures = _run_cases(range(10**6, 10**6 + N_SCAN), check)
    secs = time.perf_counter() - t0
    print("\n" + _table("prompt fuzz, scan()", outcomes, N_SCAN, secs))
    report(
        f"prompt fuzz (scan): {N_SCAN} cases in {secs:.1f} s, "
        + ", ".join(f"{k} {v}" for k, v in outcomes.most_common())
    )
    assert not failures, f"{len(failures)} failing cases, first:\n" + "\n".join(failures[:5])


def test_cases_are_seeded():
    assert make_case(123) == make_case(123) and make_case(1) != make_case(2)


# -- regressions this fuzz found (fixed in minfer/batch/prompts.py and output.py) ------------------
@pytest.mark.parametrize(
    "line,needle",
    [
        ('{"prompt": "ab", "id": "x\\ud800y"}', '"id" is not valid Unicode (a lone surrogate'),
        ('{"prompt": "ab", "id": "\\udfff"}', "lone surrogate \\udfff"),
        ('{"prompt": "ab", "id": "a\\u0000"}', '"id" holds a NUL character'),
    ],
)
def test_an_unwritable_id_is_refused_in_pass_1(tmp_path, patched, line, needle):
    """A lone-surrogate "id" passed pass 1, ran the whole file, then crashed writing its record
    (UnicodeEncodeError: a traceback, exit 1, after all the compute)."""
    src = tmp_path / "p.jsonl"
    src.write_text('"fine"\n' + line + "\n")
    out = tmp_path / "o" / "r.jsonl"
    out.parent.mkdir()
    code, _, stderr = run_cli(
        [
            "prefill",
            "--prompts",
            str(src),
            "--backend",
            "cpu",
            "-m",
            str(patched),
            "-n",
            "1",
            "-o",
            str(out),
        ]
    )
    assert code == 2 and "Traceback" not in stderr, stderr
    errs = error_lines(stderr)
    assert len(errs) == 1 and f"{src} line 2: " in errs[0] and needle in errs[0], errs
    assert list(out.parent.iterdir()) == []


def test_writer_escapes_line_breaks_json_leaves_raw(tmp_path, capsys):
    """U+2028 in an "id" (found by this fuzz) or a decoded text: written raw, a record read with
    str.splitlines() fell apart in two; now escaped, the same value read back."""
    from minfer.batch.output import ResultWriter

    rec = {"id": "a\u2028b", "text": "\x85c\u2029\\\u2028", "n": [1.5]}
    out = tmp_path / "r.jsonl"
    with ResultWriter(str(out)) as w:
        w.write(rec)
        w.commit()
    with ResultWriter("-") as w:
        w.write(rec)
        w.commit()
    for text in (out.read_bytes().decode("utf-8"), capsys.readouterr().out):
        assert len(text.splitlines()) == 1 and json.loads(text) == rec
        assert "\\u2028" in text and "\u2028" not in text


def test_writer_escapes_a_lone_surrogate(tmp_path):
    """Defence in depth: a record that has no UTF-8 form is written with JSON \\u escapes."""
    from minfer.batch.output import ResultWriter

    out = tmp_path / "r.jsonl"
    with ResultWriter(str(out)) as w:
        w.write({"id": "a\ud800", "text": "é"})
        w.write({"id": 1, "text": "é"})
        w.commit()
    lines = out.read_bytes().decode("utf-8").splitlines()
    assert [json.loads(x) for x in lines] == [
        {"id": "a\ud800", "text": "é"},
        {"id": 1, "text": "é"},
    ]
    assert lines[1] == '{"id": 1, "text": "é"}'  # UTF-8 as before where it can be


def test_a_model_context_under_128_runs_a_prompt_file(tmp_path):
    from synth_data import tiny_model

    m = tiny_model(tmp_path, seed=5, vocab=512, n_ctx=64)
    src = tmp_path / "p.jsonl"
    src.write_text('"hello"\n"' + "w" * 62 + '"\n')
    code, stdout, stderr = run_cli(
        ["prefill", "--prompts", str(src), "--backend", "cpu", "-m", str(m), "-n", "1", "-q"]
    )
    assert code == 0, stderr
    assert [json.loads(x)["n_prompt"] for x in stdout.splitlines()] == [5, 62]
