"""What the three dialects share: the sampling fields' types and bounds, token ids, constraints,
usage, the model list, the error body, and how a refused request is described.

Why it exists: a field such as a seed or a stop list means the same on SGLang's `/generate` and
on both OpenAI paths, so its type and its check are written here once and each dialect's module
(`parser.serving.wire.sglang`, `.completions`, `.chat`) only names it. The server's own bounds (the
vocabulary, the stop list's size) come in as pydantic's validation context, `Bounds`:

    GenerateRequest.model_validate_json(raw, context=Bounds(vocab_size=151936).context())
"""
from __future__ import annotations

import dataclasses
import math
from typing import Annotated, Any, Literal

import orjson
from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo,
                      model_validator)
from pydantic_core import PydanticCustomError

SEED_RANGE = (-(2**63), 2**64)  # what torch.Generator.manual_seed takes (SGLang and vLLM seed it too)
MAX_SCHEMA_DEPTH = 64  # of a JSON schema constraint: orjson writes 254 levels at most; real schemas use < 10
GREEDY_BELOW = 1e-5  # SGLang/vLLM read a smaller temperature as greedy (logits / 1e-30 overflow)
MAX_ERRORS = 3  # a refusal names at most this many fields
MAX_STOP_TOKEN_IDS = 256  # distinct stop ids a request may give: each generated token is checked against them


@dataclasses.dataclass(frozen=True)
class Bounds:
    """A server's limits, handed to validation as context (the client and loopback give none)."""

    vocab_size: int | None = None
    max_stop_strings: int | None = None
    max_stop_chars: int | None = None

    def context(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class WireModel(BaseModel):
    """A request or response body: fields the dialect defines; unknown keys ignored (as vLLM does)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, body: Any) -> Any:
        """A null field means its default, as OpenAI's and SGLang's optional fields do."""
        return {k: v for k, v in body.items() if v is not None} if isinstance(body, dict) else body

    def body(self) -> dict[str, Any]:
        """A request as sent: the fields the client set, under their wire names."""
        return self.model_dump(exclude_unset=True, by_alias=True)

    def reply(self) -> dict[str, Any]:
        """A response as sent: every field that has a value (an optional one left None is absent)."""
        return self.model_dump(exclude_none=True, by_alias=True)


def refuse(message: str, **ctx: Any) -> PydanticCustomError:
    """A validation error with our own words; ctx `at` (index or key) extends the field's location."""
    return PydanticCustomError("wire", message, ctx)


def _bound(info: ValidationInfo, name: str) -> Any:
    return (info.context or {}).get(name)


# ---------------------------------------------------------------------- number fields
def _number(value: Any) -> Any:
    """JSON numbers only: pydantic alone would take true as 1 and "7" as 7."""
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    raise refuse("expected a number, got {value}", value=repr(value)[:40])


def _at_least_zero(value: int) -> int:
    if value < 0:
        raise refuse("must be >= 0, got {value}", value=value)
    return value


def _temperature(value: float) -> float:
    if not 0.0 <= value < math.inf:
        raise refuse("must be a finite number >= 0, got {value}", value=value)
    return value


def _top_p(value: float) -> float:
    if not 0.0 < value <= 1.0:
        raise refuse("must be in (0, 1], got {value}", value=value)
    return value


def _top_k(value: int) -> int:
    if value < -1 or value == 0:
        raise refuse("must be -1 (off) or at least 1, got {value}", value=value)
    return value


def _seed(value: Any) -> Any:
    """An exact JSON integer in range: a float (what a parser makes of a too-long integer) is never rounded."""
    value = _number(value)
    low, high = SEED_RANGE
    if value is not None and (isinstance(value, float) or not low <= value < high):
        raise refuse("must fit in 64 bits (an integer in [-2**63, 2**64)), got {value}", value=repr(value)[:40])
    return value


Count = Annotated[int, BeforeValidator(_number), AfterValidator(_at_least_zero)]
Temperature = Annotated[float, BeforeValidator(_number), AfterValidator(_temperature)]
TopP = Annotated[float, BeforeValidator(_number), AfterValidator(_top_p)]
TopK = Annotated[int, BeforeValidator(_number), AfterValidator(_top_k)]
Seed = Annotated[int | None, BeforeValidator(_seed)]


def greedy(temperature: float) -> float:
    return 0.0 if temperature < GREEDY_BELOW else temperature


# ---------------------------------------------------------------------- stop strings
def _stop(value: Any, info: ValidationInfo) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise refuse("expected a string or a list of strings, got {value}", value=str(value)[:80])
    most, chars = _bound(info, "max_stop_strings"), _bound(info, "max_stop_chars")
    if most is not None and len(stops) > most:
        raise refuse("{n} stop strings; at most {most} are accepted", n=len(stops), most=most)
    for i, text in enumerate(stops):
        if not text:
            raise refuse("an empty stop string matches everywhere", at=i)
        if chars is not None and len(text) > chars:
            raise refuse("{n} characters; at most {most} are accepted", at=i, n=len(text), most=chars)
    return tuple(stops)


Stop = Annotated[tuple[str, ...], BeforeValidator(lambda v, info: () if v is None else _stop(v, info))]


# ---------------------------------------------------------------------- prompts and token ids
def _ids_in_vocab(ids: list[int], info: ValidationInfo) -> list[int]:
    vocab = _bound(info, "vocab_size")
    for i, token in enumerate(ids):
        if token < 0 or (vocab is not None and token >= vocab):
            raise refuse("token id {token} is outside the vocabulary [0, {vocab})", at=i, token=token,
                         vocab=vocab if vocab is not None else "?")
    return ids


def _one_prompt(value: Any) -> Any:
    """One prompt: a string or token ids; a batch of exactly one is unwrapped."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str) or (isinstance(value, list) and value and all(
            isinstance(t, int) and not isinstance(t, bool) for t in value)):
        return value
    raise refuse("expected one string or one non-empty list of token ids (batched prompts are not supported)")


def _checked_prompt(value: str | list[int], info: ValidationInfo) -> str | list[int]:
    return value if isinstance(value, str) else _ids_in_vocab(value, info)


Prompt = Annotated[str | list[int], BeforeValidator(_one_prompt), AfterValidator(_checked_prompt)]
TokenIds = Annotated[list[int], BeforeValidator(_one_prompt), AfterValidator(_ids_in_vocab)]


def _stop_ids(value: Any, info: ValidationInfo) -> tuple[int, ...]:
    """SGLang's and vLLM's `stop_token_ids`: a list of integer ids, each in the vocabulary (an id past it
    can never be generated, so the request would run to its token limit while the client waits for a stop)."""
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise refuse("expected a list of integer token ids, got {value}", value=str(value)[:80])
    distinct = tuple(dict.fromkeys(_ids_in_vocab(list(value), info)))  # a body of repeats was scanned per token
    if len(distinct) > MAX_STOP_TOKEN_IDS:
        raise refuse("{n} distinct stop token ids; at most {most}", n=len(distinct), most=MAX_STOP_TOKEN_IDS)
    return distinct


StopTokenIds = Annotated[tuple[int, ...], BeforeValidator(lambda v, info: () if v is None else _stop_ids(v, info))]


# ---------------------------------------------------------------------- constraints
def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth > MAX_SCHEMA_DEPTH:
                break
            stack.extend((child, depth + 1) for child in (node.values() if isinstance(node, dict) else node))
    return deepest


def _schema(value: Any) -> str | None:
    """A JSON schema (an object, a boolean or its JSON text) as compact JSON text, nested at most MAX_SCHEMA_DEPTH."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parsed = orjson.loads(value)
        except orjson.JSONDecodeError as error:
            raise refuse("a JSON string that does not parse: {error}", error=str(error)[:120]) from None
    elif isinstance(value, (dict, bool)):
        parsed = value
    else:
        raise refuse("expected an object or a JSON string, got {kind}", kind=type(value).__name__)
    if _depth(parsed) > MAX_SCHEMA_DEPTH:
        raise refuse("nested more than {most} levels deep", most=MAX_SCHEMA_DEPTH)
    return value if isinstance(value, str) else orjson.dumps(parsed).decode()


JsonSchema = Annotated[Any, BeforeValidator(_schema)]  # validated: compact JSON text (a client may hold the object)


def one_constraint(json_schema: str | None, regex: str | None) -> dict[str, str]:
    """SamplingParams' json_schema / regex keywords; both at once is refused."""
    if json_schema is not None and regex is not None:
        raise refuse("give one constraint (json schema or regex), not both")
    return {"json_schema": json_schema} if json_schema is not None else ({"regex": regex} if regex is not None else {})


# ---------------------------------------------------------------------- OpenAI's shared response parts
class PromptTokensDetails(WireModel):
    cached_tokens: int | None = 0


class Usage(WireModel):
    prompt_tokens: int | None = 0
    completion_tokens: int | None = 0
    total_tokens: int | None = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> "Usage":
        return cls(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                   total_tokens=prompt_tokens + completion_tokens,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))

    def counts(self) -> tuple[int, int]:
        """(prompt tokens, of which cached)."""
        details = self.prompt_tokens_details
        return int(self.prompt_tokens or 0), int(details.cached_tokens or 0) if details else 0


class ModelCard(WireModel):
    id: str
    object: str = "model"
    created: int | None = None
    owned_by: str | None = None
    root: str | None = None
    max_model_len: int | None = None


class ModelList(WireModel):
    """`GET /v1/models`."""

    object: str = "list"
    data: list[ModelCard] = Field(min_length=1)


# ---------------------------------------------------------------------- errors
class ErrorDetail(WireModel):
    message: str
    type: str
    code: int
    param: str | None = None


class ErrorBody(WireModel):
    """OpenAI's (and vLLM's) error object; the SGLang server answers the same shape."""

    object: Literal["error"] = "error"
    error: ErrorDetail

    @classmethod
    def of(cls, message: str, status: int, kind: str | None = None, param: str | None = None) -> "ErrorBody":
        kind = kind or ("BadRequestError" if status < 500 else "InternalServerError")
        detail = ErrorDetail(message=message, type=kind, code=status)
        if param is not None:
            detail.param = param
        return cls(error=detail)


_SHORT = {"model_type": "expected an object", "dict_type": "expected an object", "string_type": "expected a string",
          "list_type": "expected a list", "bool_type": "expected true or false", "missing": "missing",
          "int_from_float": "expected an integer"}


def describe(error: ValidationError, where: str) -> str:
    """A refused body in one line: `{where}.{field}: {why}` for each of the first MAX_ERRORS fields."""
    lines = []
    for e in error.errors(include_url=False):
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        at = (e.get("ctx") or {}).get("at")
        loc += "" if at is None else (f"[{at}]" if isinstance(at, int) else f".{at}")
        if e["type"] == "json_invalid":
            lines.append(f"{where}: body is not JSON: {e['ctx']['error']}")
        elif not loc and e["type"] == "model_type":
            lines.append(f"{where}: body must be a JSON object, got {type(e['input']).__name__}")
        else:
            short = _SHORT.get(e["type"])
            why = f"{short}, got {type(e['input']).__name__}" if short and e["type"] != "missing" else short or e["msg"]
            lines.append(f"{where}{loc}: {why}")
    return "; ".join(lines[:MAX_ERRORS])
