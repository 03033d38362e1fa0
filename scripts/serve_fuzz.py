"""Schema fuzzing of `minfer serve`: requests generated from the server's own OpenAPI document
(GET /openapi.json) by schemathesis, every operation, schema-valid and schema-breaking bodies,
each answer checked against the document (status documented, content type, body schema, no
5xx, schema-breaking data refused with a 4xx); after each operation's batch GET /health must
answer 200.

    python3 scripts/serve_fuzz.py --examples 700          # ~5,000+ requests, the full run
    python3 scripts/serve_fuzz.py --url http://127.0.0.1:8080 --api-key K --examples 50

Without --url it starts the 2-layer test llama on the CPU reference (tests/serve_helpers.py,
loopback, any free port, context 64 so a generated request is quick). Prints one line per
operation and mode and a total; exits 1 on any failed check. tests/test_serve_fuzz.py runs a
bounded sample of it in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-fuzz"


def checks():
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        negative_data_rejection,
        response_schema_conformance,
        status_code_conformance,
    )

    return [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        negative_data_rejection,
    ]


def campaign(
    url: str, key: str | None, examples: int, seed: int = 0, log=print, derandomize: bool = False
) -> dict:
    """Runs the campaign against a live server -> {requests, statuses, failures, health}.
    derandomize: the same generated requests every run (CI's sample: reproducible)."""
    import httpx
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    auth = {"Authorization": f"Bearer {key}"} if key else {}
    doc = httpx.get(url + "/openapi.json", headers=auth, timeout=30).raise_for_status().json()
    schema = schemathesis.openapi.from_dict(doc)
    fns = checks()
    out = {
        "requests": 0,
        "statuses": Counter(),
        "failures": [],
        "health": 0,
        "operations": 0,
        "refused": Counter(),
    }
    for res in schema.get_all_operations():
        op = res.ok()
        out["operations"] += 1
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            seen = Counter()

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=examples,
                deadline=None,
                database=None,
                phases=[Phase.generate],
                derandomize=derandomize,
                suppress_health_check=list(HealthCheck),
            )
            def one(case):
                t0 = time.monotonic()
                r = case.call(base_url=url, headers=auth, timeout=60)
                seen[r.status_code] += 1
                if mode == GenerationMode.POSITIVE and r.status_code == 400:
                    msg = r.json()["error"]["message"]
                    out["refused"][msg[:70]] += 1
                if r.status_code == 413 and r.json()["error"]["code"] == "request_too_large":
                    return  # a body past --max-body: refused unread, whatever it held
                try:
                    case.validate_response(r, checks=fns, headers=auth)
                except (Exception, BaseExceptionGroup) as e:  # a failed check: kept
                    out["failures"].append(
                        {
                            "operation": op.label,
                            "mode": str(mode.value),
                            "status": r.status_code,
                            "body": _short(case.body),
                            "answer": r.text[:300],
                            "check": str(e).strip().splitlines()[0][:300],
                            "s": round(time.monotonic() - t0, 3),
                        }
                    )

            import random

            random.seed(seed)
            try:
                one()
            except Unsatisfiable:  # a GET without parameters: nothing to break
                pass
            h = httpx.get(url + "/health", timeout=30)
            assert h.status_code == 200, f"/health answers {h.status_code} after {op.label}"
            out["health"] += 1
            out["requests"] += sum(seen.values())
            out["statuses"].update(seen)
            log(
                f"{op.label:32s} {mode.value:8s} {sum(seen.values()):6d} requests  "
                + " ".join(f"{k}:{v}" for k, v in sorted(seen.items()))
            )
    return out


def _short(body) -> str:
    try:
        s = json.dumps(body)
    except (TypeError, ValueError):
        s = repr(body)
    return s if len(s) < 300 else s[:300] + "..."


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--api-key", default=None)
    ap.add_argument(
        "--examples",
        type=int,
        default=700,
        help="generated cases per operation and mode (default 700)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="one JSON object at the end")
    a = ap.parse_args(argv)
    server = None
    url, key = a.url, a.api_key
    if url is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from serve_helpers import Server, small_chat_model

        tmp = tempfile.mkdtemp(prefix="minfer-fuzz-")
        server = Server(
            small_chat_model(Path(tmp), n_ctx=64),
            "--api-key",
            KEY,
            "--max-body",
            "65536",
            "--max-batch-tokens",
            "64",
            "--timeout",
            "60",
        )
        url, key = server.url, KEY
    t0 = time.monotonic()
    try:
        out = campaign(url, key, a.examples, a.seed)
    finally:
        rc = server.stop() if server is not None else 0
    s = out["statuses"]
    n5 = sum(v for k, v in s.items() if k >= 500)
    print(
        f"total: {out['requests']} requests over {out['operations']} operations in "
        f"{time.monotonic() - t0:.0f} s; statuses "
        + " ".join(f"{k}:{v}" for k, v in sorted(s.items()))
        + f"; 5xx {n5}; failed checks {len(out['failures'])}; /health after each batch "
        f"{out['health']}/{out['health']}; server exit {rc}"
    )
    for f in out["failures"][:20]:
        print("FAIL", json.dumps(f, ensure_ascii=True))
    if a.json:
        print(json.dumps({**out, "statuses": dict(s), "exit": rc}, default=str))
    return 1 if out["failures"] or n5 or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
