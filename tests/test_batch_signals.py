"""`minfer prefill --prompts F -o OUT` under SIGINT, SIGTERM and SIGHUP (issue 36, item 6).

A real subprocess (`python -m minfer prefill --prompts F -o OUT --backend cpu -m tiny -n 2`, in
its own process group as a terminal's job is) on a file of 1,500 distinct prompts (a few seconds
of CPU-reference work in ~25 waves), signalled at a moment the test waits for rather than after a
fixed sleep:
- "setup": the temporary output `.OUT.tmp-PID` has just appeared (the writer is made before
  pass 1: the prompts are being read and tokenized, or the model and the backend set up);
- "mid-run": that temporary file holds half the results (records are written as each wave
  ends, 8 KiB at a time: about half the waves have run, half are still to come).
Each must end as the CLI's convention says (minfer/cli.py, minfer/host/signals.py): exit
128 + signum (130 / 143 / 129), one line `interrupted` / `terminated` on stderr and nothing
else, no traceback; OUT absent (never partially written), no temporary file left beside it, no
process of the group left. A run to completion writes OUT whole: one valid JSON record per
prompt, in order. The table of outcomes is printed (-s) and reported in the summary.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_helpers import group_alive as _group_alive
from proc_helpers import wait_for

REPO = Path(__file__).resolve().parent.parent
N_PROMPTS = 1500
WORDS = (
    "alpha beta gamma delta river stone cloud light north quiet seven amber "
    "field glass ember frost maple orbit"
).split()
EXIT = {
    signal.SIGINT: (130, "interrupted"),
    signal.SIGTERM: (143, "terminated"),
    signal.SIGHUP: (129, "terminated"),
}
TABLE: list[tuple] = []  # (signal, moment, exit code, OUT state, temp files, results at signal)


def _preexec():
    os.setsid()  # its own group: signalled as a terminal signals its foreground job
    for s in (signal.SIGINT, signal.SIGHUP):  # a background job may have inherited SIG_IGN
        signal.signal(s, signal.SIG_DFL)


def _start(args, cwd) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, "-m", "minfer", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_preexec,
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from synth_data import tiny_model

    return tiny_model(tmp_path_factory.mktemp("bsig_tiny"), seed=3)


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    """N_PROMPTS distinct prompts of ~40 tokens (the index first: no shared prefixes)."""
    rng = random.Random(36)
    p = tmp_path_factory.mktemp("bsig_prompts") / "prompts.jsonl"
    with open(p, "w") as f:
        for i in range(N_PROMPTS):
            text = f"{i} " + " ".join(rng.choice(WORDS) for _ in range(6))
            f.write(json.dumps({"prompt": text} if i % 3 else text) + "\n")
    return p


def _args(prompts: Path, tiny: Path) -> list[str]:
    return [
        "prefill",
        "--prompts",
        str(prompts),
        "-o",
        "out.jsonl",
        "--backend",
        "cpu",
        "-m",
        str(tiny),
        "-n",
        "2",
    ]


def _tmp_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return -1


def _records(p: Path) -> int:
    try:
        return p.read_bytes().count(b"\n")
    except OSError:
        return -1


@pytest.mark.parametrize("moment", ["setup", "mid-run"])
@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_signal_leaves_no_output(tmp_path, tiny, prompts, sig, moment):
    proc = _start(_args(prompts, tiny), tmp_path)
    tmp = tmp_path / f".out.jsonl.tmp-{proc.pid}"
    if moment == "setup":
        want, step = (lambda: _size(tmp) >= 0), 0.002
    else:
        want, step = (lambda: _records(tmp) >= N_PROMPTS // 2), 0.01
    assert wait_for(want, proc, timeout=120.0, step=step), (
        f"the run ended first: {proc.communicate()}"
    )
    done = _records(tmp)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=120)
    code, err = proc.returncode, err.decode(errors="replace")
    left = sorted(p.name for p in tmp_path.iterdir())
    TABLE.append(
        (
            signal.Signals(sig).name,
            moment,
            code,
            "present" if "out.jsonl" in left else "absent",
            _tmp_files(tmp_path) or "none",
            f"{max(done, 0)}/{N_PROMPTS}",
        )
    )
    assert "Traceback" not in err and "Error" not in err, err[-3000:]
    assert code == EXIT[sig][0], err[-3000:]
    assert [x for x in err.splitlines() if x.strip()] == [EXIT[sig][1]], err[-3000:]
    assert out == b""
    assert left == [], left  # no out.jsonl, no .out.jsonl.tmp-PID
    t_end = time.monotonic() + 5
    while _group_alive(proc.pid) and time.monotonic() < t_end:
        time.sleep(0.05)
    assert _group_alive(proc.pid) == []


def test_run_to_completion_writes_every_record(tmp_path, tiny, prompts, report):
    t0 = time.perf_counter()
    proc = _start(_args(prompts, tiny), tmp_path)
    out, err = proc.communicate(timeout=300)
    wall = time.perf_counter() - t0
    code, err = proc.returncode, err.decode(errors="replace")
    assert code == 0, err[-3000:]
    assert "Traceback" not in err and not [x for x in err.splitlines() if x.startswith("error:")], (
        err
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temporary file
    data = (tmp_path / "out.jsonl").read_bytes()
    assert data.endswith(b"\n")
    recs = [json.loads(x) for x in data.decode("utf-8").splitlines()]
    assert len(recs) == N_PROMPTS
    assert [r["id"] for r in recs] == list(range(N_PROMPTS))
    assert all(r["n_prompt"] > 0 and len(r["greedy_ids"]) == 2 for r in recs)
    TABLE.append(
        (
            "none",
            "completion",
            code,
            f"complete ({len(recs)} records)",
            "none",
            f"{N_PROMPTS}/{N_PROMPTS}",
        )
    )
    head = ("signal", "moment", "exit", "OUT", "temp files left", "results written at signal")
    rows = [head] + [tuple(map(str, r)) for r in TABLE]
    w = [max(len(r[i]) for r in rows) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows)
    print(f"\nprefill --prompts ({N_PROMPTS} prompts, full run {wall:.1f} s):\n{text}")
    for r in TABLE:
        report(
            f"batch signals: {r[0]:7s} at {r[1]:10s} -> exit {r[2]}, OUT {r[3]}, "
            f"temp files left {r[4]}, results written at the signal {r[5]}"
        )
