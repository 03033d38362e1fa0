"""Chat prompts: the GGUF's own `tokenizer.chat_template`, rendered with jinja2; for a file
without one (the real Gemma 3 270M) or to override it, a built-in template by name or a
template file (`--chat-template NAME|FILE`, as llama.cpp's).

jinja2 is what Hugging Face's apply_chat_template and llama.cpp's --jinja render these templates
with; the environment mirrors HF's (sandboxed and immutable: a template is data from a
downloaded file, so it may not touch Python objects; trim_blocks and lstrip_blocks; the
loopcontrols extension; `raise_exception`, `strftime_now` and an unescaped `tojson`).

As llama.cpp does, a BOS the template writes is dropped when the tokenizer adds one itself
(else llama-3-style templates would start with two), and the template's markers
(<|im_start|>...) are always parsed as special tokens. With parse_special=False the messages'
own text is plain text: "<|im_end|>" typed by a user stays seven ordinary tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from minfer.errors import BadInput, BadModel

TEMPLATE_KEY = "tokenizer.chat_template"


def has_template(meta: Mapping[str, Any]) -> bool:
    t = meta.get(TEMPLATE_KEY)
    return isinstance(t, str) and t.strip() != ""


def messages(user: str, system: str | None = None) -> list[dict[str, str]]:
    """One user turn, after an optional system message (HF's message format)."""
    out = [] if system is None else [{"role": "system", "content": system}]
    return out + [{"role": "user", "content": user}]


# llama.cpp's built-in formats (llm_chat_apply_template) as jinja templates: a system message
# is its own turn where the format has one, else folded into the first user turn (gemma, mistral)
BUILTIN = {
    "chatml": "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
    "'<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
    "llama3": "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
    "'<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
    "gemma": "{{ bos_token }}{% set sys = messages[0]['content'] + '\n\n' "
    "if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + "
    "'\n' + (sys if loop.first else '') + m['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}"
    "{% endif %}",
    "phi3": "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + "
    "'<|end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}",
    "mistral": "{{ bos_token }}{% set sys = messages[0]['content'] + '\n\n' "
    "if messages[0]['role'] == 'system' else '' %}"
    "{% for m in messages if m['role'] != 'system' %}"
    "{% if m['role'] == 'user' %}{{ '[INST] ' + (sys if loop.first else '') + "
    "m['content'] + ' [/INST]' }}{% else %}{{ m['content'] + eos_token }}{% endif %}"
    "{% endfor %}",
}
TEMPLATE_FILE_CAP = 1 << 20  # bytes: a template is a page of jinja, not a corpus


def load_template(spec: str) -> str:
    """The jinja text of `--chat-template NAME|FILE`: a built-in by name (any case), else the
    UTF-8 file; BadInput naming both when it is neither."""
    name = spec.strip().lower()
    if name in BUILTIN:
        return BUILTIN[name]
    import os

    if not os.path.lexists(spec):
        raise BadInput(
            f"--chat-template {spec!r}: not a built-in template ({', '.join(BUILTIN)}) nor a file"
        )
    from minfer.host.fileio import read_capped

    data = read_capped(spec, TEMPLATE_FILE_CAP, "chat template")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{spec}: chat template is not UTF-8 (byte offset {e.start})") from None
    if not text.strip():
        raise BadInput(f"{spec}: chat template file is empty")
    return text


def use_template(meta: dict, spec: str | None) -> None:
    """Put `--chat-template`'s template in the metadata, over the file's own (if any)."""
    if spec is not None:
        meta[TEMPLATE_KEY] = load_template(spec)


class TemplateRefused(Exception):
    """raise_exception() called by the template itself: it refuses these messages."""


def _raise(msg: str):
    raise TemplateRefused(msg)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF's override: jinja2's own tojson HTML-escapes, which would change the prompt's text
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment():
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def render(
    meta: Mapping[str, Any],
    tok,
    msgs: list[dict[str, str]],
    add_generation_prompt: bool = True,
    what: str = "--chat",
) -> str:
    """The prompt text the model's template makes of msgs (BadInput when it has none). `what`
    names the request in error lines (a prompt file's "messages", say)."""
    from jinja2.exceptions import TemplateError

    if not has_template(meta):
        raise BadInput(
            f"{what}: this model has no tokenizer.chat_template in its GGUF "
            "metadata; give the prompt as plain text"
            + (" (--no-chat)" if what == "--chat" else "")
            + f" or name a template: --chat-template {'|'.join(BUILTIN)}|FILE"
        )
    special = lambda i: tok.token_text(i) if i is not None else ""  # noqa: E731
    try:
        text = (
            _environment()
            .from_string(meta[TEMPLATE_KEY])
            .render(
                messages=msgs,
                add_generation_prompt=add_generation_prompt,
                bos_token=special(tok.bos_id),
                eos_token=special(tok.eos_id),
            )
        )
    except TemplateRefused as e:  # e.g. "system role not supported": the request is refused
        raise BadInput(f"{what}: the model's chat template refused the messages: {e}") from None
    except TemplateError as e:
        raise BadModel(f"{what}: the model's chat template does not render ({e})") from None
    except Exception as e:  # a template's runtime error (a bad index, a sandbox refusal)
        raise BadModel(
            f"{what}: the model's chat template does not render ({type(e).__name__}: {e})"
        ) from None
    bos = special(tok.bos_id)
    if tok.add_bos and bos and text.startswith(bos):  # the tokenizer adds it (llama.cpp)
        text = text[len(bos) :]
    return text


def encode(
    meta: Mapping[str, Any], tok, user: str, system: str | None = None, parse_special: bool = True
) -> list[int]:
    """Token ids of the chat prompt: the template's markers as special tokens; the messages'
    own special-token text as special tokens too unless parse_special is False."""
    return encode_messages(meta, tok, messages(user, system), parse_special)


def encode_messages(
    meta: Mapping[str, Any],
    tok,
    msgs: list[dict[str, str]],
    parse_special: bool = True,
    what: str = "--chat",
    add_generation_prompt: bool = True,
) -> list[int]:
    """Token ids of a whole conversation (HF's [{"role": ..., "content": ...}, ...]) through
    the template (with the assistant's generation prompt after it unless told not to);
    special tokens as in encode()."""
    gen = add_generation_prompt
    contents = [m["content"] for m in msgs]
    if parse_special or not any(
        isinstance(f, int) for c in contents for f in tok._partition(c, True)
    ):
        return tok.encode(render(meta, tok, msgs, gen, what), parse_special=True)
    # Render with placeholders where the messages go, then encode the template's pieces with
    # special tokens and the messages as plain text.
    marks = [f"\x00minfer-msg-{i}\x00" for i in range(len(msgs))]
    text = render(meta, tok, [dict(m, content=k) for m, k in zip(msgs, marks)], gen, what)
    if any(text.count(k) != 1 for k in marks):
        raise BadInput(
            f"--no-special with {what}: this model's template rewrites the message "
            "text, so it cannot be kept apart from the template's special tokens"
        )
    ids = tok.encode("", add_eos=False)  # BOS when the tokenizer adds one
    rest = text
    for k, c in zip(marks, contents):
        head, rest = rest.split(k, 1)
        ids += tok.encode(head, add_bos=False, add_eos=False, parse_special=True)
        ids += tok.encode(c, add_bos=False, add_eos=False, parse_special=False)
    ids += tok.encode(rest, add_bos=False, parse_special=True)
    return ids
