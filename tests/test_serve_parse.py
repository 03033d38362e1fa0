"""The request body's parse (minfer.serve.protocol.parse_json): the fast orjson path for a flat
body and the checked json path give the same object, and every body the fast path cannot vouch
for (a duplicate key, escapes, nested objects, constants, huge integers, bad UTF-8) is decided
by the checked one, with its own 400."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
from minfer.serve import protocol as P  # noqa: E402

SAME = [
    b'{"prompt": [1, 2, 3], "max_tokens": 0, "echo": true, "logprobs": 1}',
    b'{"model": "model", "prompt": "model"}',  # a value equal to a key: the checked path
    b'{"prompt": "caf\xc3\xa9", "\xc3\xa9t\xc3\xa9": 1.5e-3}',  # non-ASCII, a float
    b'{"prompt": "a\\"b\\u00e9", "n": -0}',  # escapes: the checked path
    b'{"messages": [{"role": "user", "content": "hi"}], "stop": null}',  # nested objects
    b'{"prompt": [[1, 2], [3]], "temperature": 0}',
    b'  {"x": 1e400}  ',
]
BAD = [
    (b'{"prompt": "a", "prompt": "b"}', "duplicate key"),
    (b'{"prompt": "a", "pro\\u006dpt": "b"}', "duplicate key"),  # the same key, escaped
    (b'{"messages": [{"role": "user", "role": "x"}]}', "duplicate key"),
    (b'{"x": NaN}', "not a JSON number"),
    (b'{"x": 1', "not valid JSON"),
    (b'{"x": "\xff"}', "not UTF-8"),
    (b"[1, 2]", "must be a JSON object"),
]


@pytest.mark.parametrize("raw", SAME)
def test_the_fast_parse_equals_the_checked_one(raw):
    got = P.parse_json(raw)
    assert got == json.loads(raw) == P._parse_checked(raw)
    assert [type(v) for v in got.values()] == [type(v) for v in json.loads(raw).values()]


def test_the_fast_parse_takes_the_usual_body():
    if P.orjson is None:
        pytest.skip("orjson (the serve extra) is not installed")
    for i in (0, 2, 5):  # flat: one "{", no escapes, each key once in the text
        assert P._parse_flat(SAME[i]) == json.loads(SAME[i])
    for i in (1, 3, 4, 6):  # a key's text twice, an escape, a nested object, orjson's refusal
        assert P._parse_flat(SAME[i]) is None


@pytest.mark.parametrize("raw, msg", BAD)
def test_what_the_fast_parse_cannot_vouch_for_is_refused_as_before(raw, msg):
    with pytest.raises(P.ApiError) as e:
        P.parse_json(raw)
    assert e.value.status == 400 and msg in e.value.body()["error"]["message"]
