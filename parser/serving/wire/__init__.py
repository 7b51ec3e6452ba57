"""The HTTP wire formats, each written once: SGLang's `/generate` (`sglang`), OpenAI's
`/v1/completions` (`completions`) and `/v1/chat/completions` (`chat`), with what they share in
`common` and `openai`. The HTTP client (`parser.serving.backends.http`), the CPU server (`parser.serving.server`)
and the loopback test worker all build and read bodies through these pydantic models, so a new
dialect is one module here (docs/architecture.md).
"""
