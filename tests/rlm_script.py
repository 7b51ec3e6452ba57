"""The RLM cross-check's outer edge (helpers, not tests): a scripted OpenAI-compatible server and
the cases both rlms 0.1.3 and `method=rlm` run against it.

`ScriptServer` stands in for the model server behind both (vLLM, `parser.serve`): root turns come
from the case's script keyed by the turn number the prompt shows ("Turn i/N:"; the fallback call
is the one whose history ends on rlms' fallback request), sub-calls are answered by a rule on
their prompt, and every request body is recorded. rlms speaks `/v1/chat/completions` for both
roles; the method's root speaks `/v1/completions` with token ids (the engine renders the chat
template itself), its sub-calls `/v1/chat/completions`. Everything else on both sides is real:
rlms' `RLM` with its local REPL (the scripted code is ours), and the method with its sandbox.

    with ScriptServer(CASES["probe"], tokenizer) as server:
        recorded = run_rlms(CASES["probe"], server)       # needs rlms installed
        ours = asyncio.run(run_ours(CASES["probe"], server, tokenizer, prompt_source))

`scripts/record_rlm_fixtures.py` writes `run_rlms`'s result for every case to tests/fixtures/rlm/.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "rlm"
ROOT_MAX, SUB_MAX = 256, 64  # max tokens both sides send, root and sub
TURN = re.compile(r"Turn (\d+)/(\d+):")
FALLBACK_REQUEST = "Please provide a final answer to the user's question based on the information provided."
NEEDLE = "Edda Krohn"
PARAGRAPHS = [f"Paragraph {i}: the harbour of Port Varen saw {i + 3} ships that winter, and the nets were mended."
              for i in range(12)]
PARAGRAPHS[7] = f"Paragraph 7: the lighthouse at Port Varen was kept by {NEEDLE} for forty years."
CONTEXT = "\n".join(PARAGRAPHS)
QUESTION = "Who kept the lighthouse at Port Varen?"


def repl(*blocks: str, prose: str = "Let me work in the REPL.") -> str:
    return prose + "".join(f"\n```repl\n{block}\n```" for block in blocks)


ANSWER = repl('answer["content"] = "Edda Krohn"\nanswer["ready"] = True', prose="I found it.")


@dataclasses.dataclass(frozen=True)
class Case:
    turns: tuple[str, ...]  # the root's reply at turn i (past the end: a reply without code)
    max_iterations: int = 4
    max_errors: int | None = None
    fallback: str = "Edda Krohn (from the history)"


CASES = {
    "probe": Case((repl("print(len(context))\nprint(context[:120])"),
                   repl('import re\nm = re.search(r"kept by (\\w+ \\w+)", context)\nprint(m.group(1))\n'
                        'answer["content"] = m.group(1)\nanswer["ready"] = True'))),
    "batched_map": Case((repl("chunks = [context[i:i + 400] for i in range(0, len(context), 400)]\nprint(len(chunks))"),
                         repl('replies = llm_query_batched([f"Who kept the lighthouse? Text: {c}" for c in chunks])\n'
                              "print(replies)"),
                         repl('final = llm_query("Combine these answers into one name: " + "; ".join(replies))\n'
                              'answer["content"] = final\nanswer["ready"] = True'))),
    "cell_error": Case((repl("x = 1 / 0"), repl("print(undefined_name)"), repl("y = 2\nprint(y)"), ANSWER)),
    "long_output": Case((repl('print("x" * 25000)', 'big = "y" * 30000\nprint(big)\nprint(len(big))'), ANSWER)),
    "iterations_exhausted": Case(("I will think about it first, without code.", repl("print(context.count('Port'))")),
                                 max_iterations=2),
    "answer_rebound": Case((repl("print(context[:40])"), repl('answer = {"content": "Edda Krohn", "ready": True}'))),
    "max_errors": Case((repl("print(context[:10])"), repl("1 / 0"), repl("[][1]"), ANSWER), max_errors=2),
}


_SANDBOX: list[dict[str, Any]] = []  # sandbox_settings' answer, once per process


async def sandbox_settings() -> dict[str, Any]:
    """The method's `sandbox` section for these tests: the shipped default where this machine can
    isolate the REPL worker; where it cannot (a container without user namespaces), the named unsafe
    option, since every cell here is the test's own code (the isolation itself is
    tests/test_repl_sandbox_on_cpu.py's)."""
    from parser.engine.sandbox.repl import ReplSandbox

    async def llm(prompts: list[str], model: str | None) -> list[str]:
        return ["" for _ in prompts]

    if not _SANDBOX:
        async with await ReplSandbox.start("", llm=llm, allow_unisolated=True) as repl:
            _SANDBOX.append({"allow_unisolated": True} if repl.missing else {})
    return _SANDBOX[0]


def sub_reply(prompt: str) -> str:
    """The sub-model's rule: the name where a prompt holds it, else "unknown"."""
    return NEEDLE if NEEDLE in prompt else "unknown"


class ScriptServer:
    """A threaded HTTP server on 127.0.0.1 answering one case; `requests` is every (path, body)."""

    def __init__(self, case: Case, tokenizer: Any = None):
        self.case, self.tokenizer = case, tokenizer
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, body))
                reply = outer.answer(self.path, body)
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def root_reply(self, text: str, fallback: bool) -> str:
        if fallback:
            return self.case.fallback
        turns = TURN.findall(text)
        index = int(turns[-1][0]) - 1
        return self.case.turns[index] if index < len(self.case.turns) else "Still thinking."

    def answer(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        if path.endswith("/chat/completions"):
            messages = body["messages"]
            if messages[0]["role"] == "system":
                text = self.root_reply("\n".join(m["content"] for m in messages if m["role"] == "user"),
                                       messages[-1]["role"] == "assistant")
            else:
                text = sub_reply(messages[-1]["content"])
            return {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"], "usage": usage,
                    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}
        prompt = self.tokenizer.decode(body["prompt"], skip_special_tokens=False)
        last_assistant = prompt.rfind("<|im_start|>assistant\n", 0, prompt.rfind("<|im_start|>assistant\n"))
        text = self.root_reply(prompt, FALLBACK_REQUEST in prompt[last_assistant:])
        usage["prompt_tokens"] = len(body["prompt"])
        return {"id": "x", "object": "text_completion", "created": 0, "model": body.get("model", "root"), "usage": usage,
                "choices": [{"index": 0, "finish_reason": "stop", "text": text}]}

    def __enter__(self) -> "ScriptServer":
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- what was sent ----------------------------------------------------------------------------
    def roots(self) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p.endswith("/v1/completions")
                or (p.endswith("/chat/completions") and b["messages"][0]["role"] == "system")]

    def subs(self) -> list[dict[str, Any]]:
        return [b for p, b in self.requests if p.endswith("/chat/completions") and b["messages"][0]["role"] != "system"]


def sampling(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields that mean the same on both sides (rlms renames max_tokens to max_completion_tokens)."""
    return {"temperature": body.get("temperature"), "max_tokens": body.get("max_completion_tokens", body.get("max_tokens"))}


def run_rlms(name: str, server: ScriptServer) -> dict[str, Any]:
    """rlms 0.1.3 on the case, as a user runs it; what it sent and returned (a fixture's content)."""
    import importlib.metadata

    from rlm import RLM
    from rlm.utils.exceptions import ErrorThresholdExceededError

    case = CASES[name]
    rlm = RLM(backend="openai", backend_kwargs={"base_url": server.url + "/v1", "api_key": "x", "model_name": "root"},
              environment="local", max_iterations=case.max_iterations, max_errors=case.max_errors,
              sampling_args={"temperature": 0.0, "max_tokens": ROOT_MAX},
              sub_sampling_args={"temperature": 0.0, "max_tokens": SUB_MAX})
    # rlms' LocalREPL redirects the process's stdout and stderr while a cell runs, and its HTTP client logs
    # each sub-call at INFO: where an earlier test in the same pytest worker configured logging, those lines
    # (or a handler's "Logging error" on a stream since closed) land in the REPL output rlms sends back
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)
    try:
        result = rlm.completion(CONTEXT, root_prompt=QUESTION)
        answer, stop, usage = result.response, None, result.usage_summary.to_dict()
    except ErrorThresholdExceededError as error:
        answer, stop, usage = error.partial_answer, "max_errors", None
    finally:
        logging.disable(previous)
    roots = server.roots()
    fallback = roots[-1]["messages"][-1] == {"role": "assistant", "content": FALLBACK_REQUEST}
    return {"case": name, "rlms_version": importlib.metadata.version("rlms"), "answer": answer, "stop": stop,
            "iterations": len(roots) - fallback, "fallback": fallback,
            "root_messages": [b["messages"] for b in roots], "root_sampling": [sampling(b) for b in roots],
            "sub_prompts": sorted(b["messages"][0]["content"] for b in server.subs()),
            "sub_messages_shape": sorted({json.dumps([m["role"] for m in b["messages"]]) for b in server.subs()}),
            "sub_sampling": sorted({json.dumps(sampling(b)) for b in server.subs()}), "usage_summary": usage}


async def run_ours(name: str, server: ScriptServer, tokenizer: Any, prompt_source: str, *, sub_url: str | None = None,
                   record: Any = None, **settings: Any) -> tuple[Any, list[list[dict]]]:
    """`method=rlm` on the case (root over /v1/completions, subs over chat at `sub_url`, default the
    server); its result and the message list it rendered at every turn. `record`: a function from the
    models to the models the method runs on (the latency bench's `eval.latency.Recorder`); `settings`: RLMMethod's."""
    from parser.methods import Sample
    from parser.methods.rlm import RLMMethod
    from parser.methods.rlm.turns import RlmTurns
    from parser.serving.backends.http import HttpBackend
    from parser.serving.backends.models import Models

    case, seen = CASES[name], []
    original = RlmTurns.messages

    def spy(self: RlmTurns, *args: Any) -> list[dict[str, Any]]:
        seen.append(original(self, *args))
        return seen[-1]

    models = Models(HttpBackend(server.url, api="completions", model="root", server="generic"), tokenizer,
                    HttpBackend(sub_url or server.url, api="chat", model="root", server="generic"), tokenizer)
    models = record(models) if record else models
    method = RLMMethod(models, episode={"lead_temperature": 0.0, "lead_thinking": False, "max_attempts": 1,
                                        "max_turns": case.max_iterations, "max_tokens_per_turn": ROOT_MAX,
                                        **settings.pop("episode", {})},
                       **{"max_errors": case.max_errors, "sub_max_new_tokens": SUB_MAX, "sub_temperature": 0.0,
                          "prompt_source": prompt_source, "sandbox": await sandbox_settings(), **settings})
    RlmTurns.messages = spy
    try:
        result = await method.run(Sample(name, QUESTION, [NEEDLE], CONTEXT))
    finally:
        RlmTurns.messages = original
        await method.aclose()
    return result, seen
