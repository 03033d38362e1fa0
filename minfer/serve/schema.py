"""The server's OpenAPI document (GET /openapi.json): request and response bodies as pydantic
models used for the schema only.

The routes parse and check bodies themselves (protocol.py: strict types, OpenAI's error
object), so FastAPI's generated document has no bodies; these models say what protocol.py
accepts and what the routes answer, bounded by the served model (token ids < its vocabulary,
`model` its name). The schema fuzzing campaign (scripts/serve_fuzz.py) generates requests
from this document and checks every answer against it, so a drift either way is a failure.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from minfer.reference.ops import TOP_MAX
from minfer.serve.pooling import MAX_ITEMS, RERANK_PATHS
from minfer.serve.protocol import MAX_PROMPTS, MAX_STOPS

REF = "#/components/schemas/{model}"


class _Open(BaseModel):  # unknown fields are ignored, as OpenAI and vLLM do
    model_config = ConfigDict(extra="allow")


def _requests(vocab: int, name: str, d_model: int = 1 << 20):
    """The request models of a server: token ids in [0, vocab), `model` the served name."""
    Tid = Annotated[int, Field(ge=0, le=vocab - 1)]
    Model = Optional[Literal[name]]  # noqa: F821 (a runtime literal: the served name)
    Stop = Optional[Union[str, Annotated[list[str], Field(max_length=MAX_STOPS)]]]
    Zero = Optional[Annotated[float, Field(ge=0, le=0)]]

    class StreamOptions(_Open):
        include_usage: Optional[bool] = None

    class Greedy(_Open):
        model: Model = None
        temperature: Zero = None
        n: Optional[Literal[1]] = None
        seed: Optional[int] = None
        presence_penalty: Zero = None
        frequency_penalty: Zero = None
        top_p: Optional[Annotated[float, Field(gt=0, le=1)]] = None
        logit_bias: Optional[Annotated[dict[str, Any], Field(max_length=0)]] = None
        stop: Stop = None
        stream: Optional[bool] = None
        stream_options: Optional[StreamOptions] = None
        ignore_eos: Optional[bool] = None

    class CompletionRequest(Greedy):
        prompt: Union[
            str,
            Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)],
            Annotated[list[Tid], Field(min_length=1)],
            Annotated[list[list[Tid]], Field(min_length=1, max_length=MAX_PROMPTS)],
        ]
        max_tokens: Optional[Annotated[int, Field(ge=0)]] = None
        echo: Optional[bool] = None
        logprobs: Optional[Annotated[int, Field(ge=0, le=TOP_MAX)]] = None
        best_of: Optional[Literal[1]] = None
        suffix: Optional[Literal[""]] = None
        add_special_tokens: Optional[bool] = None

    class TextPart(_Open):
        type: Literal["text"]
        text: str

    class Message(_Open):
        role: Annotated[str, Field(min_length=1)]
        content: Union[str, None, list[TextPart]] = None

    Messages = Annotated[list[Message], Field(min_length=1)]

    class ChatRequest(Greedy):
        messages: Messages
        max_tokens: Optional[Annotated[int, Field(ge=0)]] = None
        max_completion_tokens: Optional[Annotated[int, Field(ge=0)]] = None
        logprobs: Optional[bool] = None
        top_logprobs: Optional[Annotated[int, Field(ge=0, le=TOP_MAX)]] = None
        add_generation_prompt: Optional[bool] = None

    class TokenizeRequest(_Open):
        model: Model = None
        prompt: Optional[str] = None
        messages: Optional[Messages] = None
        add_special_tokens: Optional[bool] = None
        add_generation_prompt: Optional[bool] = None
        return_token_strs: Optional[bool] = None

    class DetokenizeRequest(_Open):
        model: Model = None
        tokens: list[Tid]

    Items = Annotated[int, Field(ge=1, le=MAX_ITEMS)]  # (a bound on counts below)

    class EmbeddingRequest(_Open):
        model: Model = None
        input: Union[
            Annotated[str, Field(min_length=1)],
            Annotated[
                list[Annotated[str, Field(min_length=1)]], Field(min_length=1, max_length=MAX_ITEMS)
            ],
            Annotated[list[Tid], Field(min_length=1)],
            Annotated[
                list[Annotated[list[Tid], Field(min_length=1)]],
                Field(min_length=1, max_length=MAX_ITEMS),
            ],
        ]
        encoding_format: Optional[Literal["float", "base64"]] = None
        dimensions: Optional[Annotated[int, Field(ge=1, le=d_model)]] = None

    class ScoreRequest(_Open):
        model: Model = None
        query: Union[str, Annotated[list[Tid], Field(min_length=1)]]
        items: Union[
            str,
            Annotated[list[str], Field(min_length=1, max_length=MAX_ITEMS)],
            Annotated[
                list[Annotated[list[Tid], Field(min_length=1)]],
                Field(min_length=1, max_length=MAX_ITEMS),
            ],
        ]
        label_token_ids: Annotated[list[Tid], Field(min_length=1)]
        apply_softmax: Optional[bool] = None
        item_first: Optional[bool] = None

    class Document(_Open):
        text: str

    class RerankRequest(_Open):
        model: Model = None
        query: str
        documents: Annotated[list[Union[str, Document]], Field(min_length=1, max_length=MAX_ITEMS)]
        top_n: Optional[Items] = None
        return_documents: Optional[bool] = None

    return (
        CompletionRequest,
        ChatRequest,
        TokenizeRequest,
        DetokenizeRequest,
        EmbeddingRequest,
        ScoreRequest,
        RerankRequest,
    )


# -- responses ----------------------------------------------------------------------------------
Finish = Optional[Literal["stop", "length"]]
Lp = Optional[float]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[Lp]
    top_logprobs: list[Optional[dict[str, float]]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Finish


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class TopEntry(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenEntry(TopEntry):
    top_logprobs: list[TopEntry]


class ChatLogprobs(BaseModel):
    content: list[TokenEntry]


class ChatMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: Optional[ChatLogprobs]
    finish_reason: Finish


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Tokens(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class Text(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class Embedding(BaseModel):
    object: Literal["embedding"]
    index: int
    embedding: Union[list[float], str]  # floats, or base64 of little-endian f32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embeddings(BaseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Scores(BaseModel):
    scores: list[list[float]]
    model: str
    object: Literal["scoring"]
    usage: Usage


class RerankDocument(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: Optional[RerankDocument] = None


class Rerank(BaseModel):
    model: str
    object: Literal["list"]
    usage: EmbeddingUsage
    results: list[RerankResult]


class Health(BaseModel):
    status: Literal["ok"]


class TokenizerInfo(BaseModel):
    tokenizer_class: str
    eos_token: Optional[str]
    bos_token: Optional[str]
    pad_token: Optional[str]
    add_bos_token: bool
    chat_template: Optional[str]
    model_max_length: int
    vocab_size: int


class CompletionChunkChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs]
    finish_reason: Finish


class CompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Optional[Usage] = None


class Delta(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: Optional[ChatLogprobs]
    finish_reason: Finish


class ChatChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


class ErrorBody(BaseModel):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class Error(BaseModel):
    error: ErrorBody


# the statuses each kind of route may answer besides 200 (docs/serve.md's error table)
_ANY = (401, 404, 405, 408, 413, 503)
_POST = _ANY + (400,)
_RUN = _POST + (429, 500, 504)


def openapi(app, vocab: int, name: str, d_model: int = 1 << 20) -> dict:
    """FastAPI's document for app's routes, with the bodies and answers filled in for ours
    (a route this table does not know keeps FastAPI's entry)."""
    from fastapi.openapi.utils import get_openapi

    reqs = _requests(vocab, name, d_model)
    resps = (
        Completion,
        ChatCompletion,
        Tokens,
        Text,
        ModelList,
        Health,
        TokenizerInfo,
        Error,
        CompletionChunk,
        ChatChunk,
        Embeddings,
        Scores,
        Rerank,
    )
    _, defs = models_json_schema([(m, "validation") for m in reqs + resps], ref_template=REF)
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    comps = doc.setdefault("components", {})
    comps.setdefault("schemas", {}).update(defs.get("$defs", {}))
    comps["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    ref = lambda m: {"$ref": REF.format(model=m.__name__)}  # noqa: E731
    json_ = lambda m: {"application/json": {"schema": ref(m)}}  # noqa: E731
    sse = lambda m: {"text/event-stream": {"schema": _event(ref(m), ref(Error))}}  # noqa: E731
    C, Ch, Tk, Dt, Em, Sc, Rr = reqs
    table = {  # (path, method): (request model, 200 content, other statuses)
        ("/v1/completions", "post"): (C, {**json_(Completion), **sse(CompletionChunk)}, _RUN),
        ("/v1/chat/completions", "post"): (Ch, {**json_(ChatCompletion), **sse(ChatChunk)}, _RUN),
        ("/tokenize", "post"): (Tk, json_(Tokens), _POST),
        ("/detokenize", "post"): (Dt, json_(Text), _POST),
        ("/v1/models", "get"): (None, json_(ModelList), _ANY),
        ("/tokenizer_info", "get"): (None, json_(TokenizerInfo), _ANY),
        ("/metrics", "get"): (None, {"text/plain": {"schema": {"type": "string"}}}, _ANY),
        ("/health", "get"): (None, json_(Health), (503,)),
        ("/v1/embeddings", "post"): (Em, json_(Embeddings), _RUN),
        ("/v1/score", "post"): (Sc, json_(Scores), _RUN),
        **{(p, "post"): (Rr, json_(Rerank), _RUN) for p in RERANK_PATHS},
    }
    for (path, method), (req, ok, codes) in table.items():
        op = doc.get("paths", {}).get(path, {}).get(method)
        if op is None:
            continue
        if req is not None:
            op["requestBody"] = {"required": True, "content": json_(req)}
        op["responses"] = {
            "200": {"description": "the answer", "content": ok},
            **{
                str(c): {"description": Error.__doc__ or "an error", "content": json_(Error)}
                for c in codes
            },
        }
        if path != "/health":
            op["security"] = [{"bearer": []}]
    return doc


def _event(chunk: dict, error: dict) -> dict:
    """A server-sent event: `data: [DONE]` last, before it a chunk (or an error met
    mid-stream) as JSON."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [chunk, error]},
                    },
                ],
            }
        },
    }
