"""The chat format: the control tokens of the chat template the project's models speak, in one place.

Why a module: the end of an assistant turn, the tokens every lead generation stops at, the
markers the release strips from a decoded turn, and the strings a tokenizer turns into control
tokens are facts of one chat format (ChatML: Qwen2.5 / Qwen3 / Qwen3.5, SmolLM2). Written as a
literal at each site, one site drifts the day a model with another format arrives. Untrusted
text (documents, tool output, model replies shown back) must never become control tokens:
`control_tokens(tokenizer)` is every string the tokenizer would read as one, and `neutralize`
breaks each of them in a text so that it is tokenised as the characters it shows.

    CHATML.end_of_turn_id(tokenizer)   # <|im_end|>'s id; a tokenizer without it is refused
    CHATML.stop_token_ids(tokenizer)   # what every lead generation stops at
    CHATML.strip_end(text)             # one generation's text without its end-of-turn marker
    CHATML.control_tokens(tokenizer)   # every string this tokenizer encodes as one control token
    CHATML.neutralize(document, tokenizer)   # ... none of them left in `document`

This module imports nothing from the package.
"""
from __future__ import annotations

import dataclasses
import re
import weakref
from typing import Any

# Inserted after the first character of a control-token string found in untrusted text: an
# invisible character (WORD JOINER) no tokenizer's added-token matcher sees through, and no
# control token contains, so the text keeps its look and loses its power.
WORD_JOINER = "\u2060"
# The shape of ChatML's and Qwen's control tokens (<|im_end|>, <|vision_pad|>, ...), broken even
# when the tokenizer at hand lacks one: a server on the other side may use a larger vocabulary.
_BAR_TOKEN = r"<\|[^\s<>|]{1,64}\|>"
_PATTERNS: "weakref.WeakKeyDictionary[Any, re.Pattern[str]]" = weakref.WeakKeyDictionary()


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    name: str
    turn_start: str  # opens a message: "<|im_start|>{role}\n"
    end_of_turn: str  # closes a message; the chat template's assistant turns end here
    end_of_text: str  # the tokenizer's end-of-document token, also a stop token for generations
    tags: tuple[str, ...] = ()  # tag-shaped added tokens of the format's model families (<think>, ...)

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        """The tokens a generation ends on (end of turn first)."""
        return (self.end_of_turn, self.end_of_text)

    @property
    def tokens(self) -> tuple[str, ...]:
        """The format's own control tokens."""
        return (self.turn_start, self.end_of_turn, self.end_of_text)

    def token_id(self, tokenizer: Any, token: str) -> int:
        """The id of one of the format's tokens; refused if the tokenizer does not have it as one token."""
        found = tokenizer.convert_tokens_to_ids(token)
        if found is None or (found == getattr(tokenizer, "unk_token_id", None) and token != getattr(tokenizer, "unk_token", None)):
            raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', type(tokenizer).__name__)!r} has no "
                             f"{token} token: it does not speak the {self.name} chat format")
        return int(found)

    def end_of_turn_id(self, tokenizer: Any) -> int:
        return self.token_id(tokenizer, self.end_of_turn)

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        return [self.token_id(tokenizer, t) for t in self.stop_tokens]

    def strip_end(self, text: str) -> str:
        """A generation's text without the end-of-turn marker it stopped on (a backend may keep it)."""
        return text.removesuffix(self.end_of_turn)

    def control_tokens(self, tokenizer: Any) -> frozenset[str]:
        """Every string this tokenizer turns into one reserved token when it meets it in raw text:
        the format's tokens, the tokenizer's special tokens, and its other added tokens (Qwen's
        `<think>`, `<tool_call>`, which the lead's parser and the template read as markup)."""
        added = {t.content for t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values()}
        return frozenset(added | set(getattr(tokenizer, "all_special_tokens", ())) | set(self.tokens))

    def neutralize(self, text: str, tokenizer: Any = None) -> str:
        """`text` with every control-token string (`control_tokens`, the format's tags, and
        anything shaped like `<|...|>`) broken by a WORD JOINER after its first character:
        tokenised, it can never produce a control token. Linear in `text`; idempotent."""
        return self._pattern(tokenizer).sub(lambda m: m.group()[0] + WORD_JOINER + m.group()[1:], text)

    def _pattern(self, tokenizer: Any) -> "re.Pattern[str]":
        try:
            return _PATTERNS[tokenizer]
        except (KeyError, TypeError):
            pass
        found = self.control_tokens(tokenizer) if tokenizer is not None else frozenset(self.tokens)
        tokens = {t for t in found | set(self.tags) if len(t) > 1}  # a one-character added token cannot be broken
        literal = "|".join(re.escape(t) for t in sorted(tokens, key=len, reverse=True))
        pattern = re.compile(f"{_BAR_TOKEN}|{literal}")
        try:
            _PATTERNS[tokenizer] = pattern
        except TypeError:  # None, or a tokenizer that takes no weak reference
            pass
        return pattern


CHATML = ChatFormat("ChatML", turn_start="<|im_start|>", end_of_turn="<|im_end|>", end_of_text="<|endoftext|>",
                    tags=("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"))
