"""Train/eval parity: eval's "parser" method and the verl agent loop run the same episode.

    .venv/bin/pytest tests/test_verl_parity_on_cpu.py -q

Same scripted lead outputs, same loopback HTTP subagents, same episode settings (the shipped
training config's `parser.episode`). Eval goes through `parser.methods.parser.ParSerMethod`;
training through verl's AgentLoopWorker and `parser.methods.parser.train.ParserAgentLoop`. The lead
must see the same token stream every turn, the trained mask must be the eval lead's generated
spans, and both must end with the same answer.

Under both protocols (this project's and the authors' release's, whose prose comes from the
stand-in checkout `support.release_standin`), `build_method(...).run` and the verl agent
loop must give the subagents the same chunk texts — the release's `Paragraph N:` chunks under
`release`, which eval once replaced by this project's `Document N:` chunks — and the lead the
same first prompt, token for token.
"""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl_fakes import ANSWER, NEEDLE, SCRIPT, ScriptedServerManager, dataset_row, run_verl_worker, save_tiny_model, train_config  # noqa: E402

from parser.serving.backends.http import HttpBackend  # noqa: E402
from parser.serving.backends.models import Models  # noqa: E402
from parser.methods import method_class, method_config  # noqa: E402
from parser.methods.base import Sample  # noqa: E402
from parser.engine.protocol import protocol_for  # noqa: E402
from parser.engine.readers.subagent import render_chat  # noqa: E402
from parser.serving.loopback import start_loopback  # noqa: E402
from support.release_standin import write_release_standin  # noqa: E402
from parser.train.worker import episode_config  # noqa: E402
from parser.train.reward import ANSWER_KEY  # noqa: E402
from scripted_lead import ScriptedLead  # noqa: E402


def eval_episode(config, subagent_url, tokenizer, row, method_name):
    """The eval side: the class configs/method/<method_name>.yaml names, on the training config's episode, the scripted
    lead, the same loopback subagents. Returns (lead, episode, result)."""
    lead = ScriptedLead(tokenizer, SCRIPT, logprob=-1.0)  # the eval side's lead: the same script
    episode = episode_config(OmegaConf.to_container(config.parser.episode), 10**9)
    episode.max_response_tokens = None  # eval has no response budget
    models = Models(lead=lead, lead_tokenizer=tokenizer, subagent=HttpBackend(subagent_url), subagent_tokenizer=tokenizer)
    method = method_class(method_config(method_name)["_target_"])(models, episode=episode)
    sample = Sample(id=row["extra_info"]["id"], question=row["extra_info"]["question"],
                    answers=row["extra_info"]["answers"], context=row["extra_info"]["context"])
    result = asyncio.run(method.run(sample))
    asyncio.run(models.subagent.aclose())
    return lead, episode, result


@pytest.fixture(scope="module")
def both_paths(tiny_qwen3_5_model, tiny_tokenizer, tmp_path_factory):
    model_dir = save_tiny_model(tiny_qwen3_5_model, tiny_tokenizer, str(tmp_path_factory.mktemp("tiny-lead")))
    row = dataset_row(0)
    with start_loopback("subagent-w1", needle=NEEDLE, needle_answer=ANSWER) as loopback:
        config = train_config(loopback.url, model_dir)
        manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer)
        out = run_verl_worker(config, manager, [row])
        train_records = sorted((r.routing_key, r.prefix_hash) for r in loopback.worker.records)

        loopback.worker.records.clear()
        lead, _, result = eval_episode(config, loopback.url, tiny_tokenizer, row, "parser")
        eval_records = sorted((r.routing_key, r.prefix_hash) for r in loopback.worker.records)
    return out, manager, lead, result, train_records, eval_records


def test_same_prompt_token_stream_every_turn(both_paths):
    out, manager, lead, *_ = both_paths
    assert [r.prompt_ids for r in manager.requests] == lead.prompts


def test_same_full_stream_and_mask(both_paths):
    out, _, lead, *_ = both_paths
    stream = lead.prompts[-1] + lead.generated[-1]
    eval_mask = [0] * len(stream)
    for prompt, generated in zip(lead.prompts, lead.generated, strict=True):
        eval_mask[len(prompt) : len(prompt) + len(generated)] = [1] * len(generated)
    p = out.batch["prompts"].shape[1]
    valid = out.batch["attention_mask"][0].bool()
    train_stream = out.batch["input_ids"][0][valid].tolist()
    assert train_stream == stream
    prompt_len = int(valid[:p].sum())
    train_mask = out.batch["response_mask"][0][valid[p:]].tolist()
    assert train_mask == eval_mask[prompt_len:] and not any(eval_mask[:prompt_len])


def test_same_answer_turns_and_subagent_requests(both_paths):
    out, _, _, result, train_records, eval_records = both_paths
    assert result.answer == out.non_tensor_batch[ANSWER_KEY][0] == ANSWER
    assert result.steps == out.non_tensor_batch["parser_stats"][0]["turns"] == 2
    assert train_records == eval_records and train_records  # same (chunk, prompt prefix) requests


# --- both protocols: the same inputs reach the subagents and the lead -----------------------

def _subagent_prompts(records):
    return sorted((r.routing_key, r.prompt) for r in records)


def _chunk_texts(prompts, protocol, tokenizer, query):
    """The chunk each subagent prompt carries, cut out by the protocol's own frame around it."""
    marker = "\u2063chunk\u2063"
    before, after = render_chat(tokenizer, [{"role": "user", "content": protocol.subagent_prompt(marker, query)}],
                                enable_thinking=False).split(marker)
    texts = []
    for _, prompt in prompts:
        assert prompt.startswith(before) and prompt.endswith(after)
        texts.append(prompt[len(before): len(prompt) - len(after)])
    return texts


@pytest.fixture(scope="module", params=["parser", "release"])
def protocol_paths(request, tiny_qwen3_5_model, tiny_tokenizer, tmp_path_factory):
    """One row through verl's worker and through `build_method(...).run`, under one protocol."""
    name = request.param
    model_dir = save_tiny_model(tiny_qwen3_5_model, tiny_tokenizer, str(tmp_path_factory.mktemp(f"lead-{name}")))
    repo = str(write_release_standin(tmp_path_factory.mktemp("PARSER")))
    overrides = [f"parser.episode.protocol={name}", f"parser.episode.protocol_release.repo={repo}"]
    row = dataset_row(0)
    with start_loopback("subagent-w1", needle=NEEDLE, needle_answer=ANSWER, keep_prompts=True) as loopback:
        config = train_config(loopback.url, model_dir, overrides)
        manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer)
        out = run_verl_worker(config, manager, [row])
        train = _subagent_prompts(loopback.worker.records)

        loopback.worker.records.clear()
        lead, episode, result = eval_episode(config, loopback.url, tiny_tokenizer, row,
                                             "parser_release" if name == "release" else "parser")
        evaluation = _subagent_prompts(loopback.worker.records)
    return name, protocol_for(episode), out, manager, lead, result, train, evaluation, row


def test_eval_and_training_give_subagents_the_same_chunks_and_prompts(protocol_paths, tiny_tokenizer):
    name, protocol, out, manager, lead, result, train, evaluation, row = protocol_paths
    query = row["extra_info"]["question"]
    assert train and train == evaluation  # every (chunk routing key, whole subagent prompt), identical
    train_chunks = _chunk_texts(train, protocol, tiny_tokenizer, query)
    eval_chunks = _chunk_texts(evaluation, protocol, tiny_tokenizer, query)
    assert train_chunks == eval_chunks == [c.text for c in protocol.chunk(row["extra_info"]["context"], tiny_tokenizer)]
    header = "Paragraph 1: " if name == "release" else "Document 1:\n"
    assert train_chunks[0].startswith(header) and len(train_chunks) > 1
    print(f"\n[{name}] {len(train_chunks)} chunks, identical in eval and training; chunk 0 starts {train_chunks[0][:40]!r}")


def test_eval_and_training_give_the_lead_the_same_first_prompt(protocol_paths, tiny_tokenizer):
    name, protocol, out, manager, lead, result, *_ = protocol_paths
    first = manager.requests[0].prompt_ids
    assert first == lead.prompts[0]
    valid = out.batch["attention_mask"][0, : out.batch["prompts"].shape[1]].bool()
    assert out.batch["prompts"][0][valid].tolist() == first
    shown = tiny_tokenizer.decode(first)  # the protocol's own system and user turn (the template trims them)
    assert protocol.lead_system().strip() in shown and protocol.lead_user(result.trace.question).strip() in shown
    assert ("STAND-IN lead system prompt" in shown) == ("## Question" in shown) == (name == "release")
    assert result.answer == out.non_tensor_batch[ANSWER_KEY][0] == ANSWER
    print(f"[{name}] first lead prompt: {len(first)} token ids, identical in eval and training")
