"""The HTTP wire formats, each written once: SGLang's `/generate` (`sglang`), OpenAI's
`/v1/completions` (`completions`) and `/v1/chat/completions` (`chat`), with what they share in
`common` and `openai`, and the score readers in `scores`. `dialect.DIALECTS` ties each path to its
request/response pair; the HTTP client (`parser.serving.backends.http`), the in-process SGLang
engine, the CPU server (`parser.serving.server`) and the loopback worker (`parser.serving.loopback`)
all go through it, so a new format is one module here plus one `Dialect` row (docs/architecture.md).
"""
