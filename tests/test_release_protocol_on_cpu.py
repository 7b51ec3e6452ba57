"""`protocol: release`, row by row against the authors' release (github.com/cuhk-parser/PARSER).

Each test restates one rule of the release (docs/fidelity.md's table) and derives the expected
text from it; the release's behaviour is reached through its protocol object
(`parser.engine.protocol.ReleaseProtocol`) or the function that object uses. CI has no network and the project
carries no copy of the release's prose, so `support.release_standin` writes a stand-in
checkout (same files, same constant names and literal forms, placeholder prose) in tmp_path: it
stands in for a real clone. The scripted episode runs the real engine on the real Qwen3.5
tokenizer and chat template; only the lead's generations and the subagents' reply texts are
scripted.

    .venv/bin/pytest tests/test_release_protocol_on_cpu.py -q
"""
from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from parser.text import release
from parser.text.actions import parse_lead_output, parse_release_turn
from parser.serving.types import BackendError
from parser.text.chunking import Chunk, chunk_document, release_chunks, render_paragraphs
from parser.engine.episode import EpisodeConfig, EpisodeEngine
from parser.engine.gather import parse_release_reply, parse_reply, render_observation
from parser.engine.protocol import protocol_for
from parser.engine.readers.subagent import SubagentReader
from parser.engine.tools import ReaderReply
from parser.text.reward import exact_match, normalize_answer, release_normalize, release_sub_em
from scripted_lead import ScriptedLead
from support.release_standin import write_release_standin

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def release_repo(tmp_path_factory) -> str:
    """A stand-in for `git clone https://github.com/cuhk-parser/PARSER` (placeholder prose)."""
    return str(write_release_standin(tmp_path_factory.mktemp("PARSER")))


def release_config(repo: str, **settings) -> EpisodeConfig:
    return EpisodeConfig(protocol="release", protocol_release={"repo": repo}, **settings)


# --- prose: read from a checkout, never executed, never copied ---

def test_prompts_load_from_the_checkout_without_executing_it(tmp_path):
    repo = write_release_standin(tmp_path / "PARSER")
    loop = repo / "train/scripts/parser_agent_loop.py"
    loop.write_text("raise SystemExit('executed')\n" + loop.read_text())  # importing it would exit
    prompts = release.load_release_prompts(str(repo))
    assert prompts.lead_system.startswith("STAND-IN lead system prompt")
    assert prompts.invalid_hint.startswith("STAND-IN invalid step")  # a local of a method, found by ast
    assert prompts.tools[0]["function"]["name"] == "query_agents"
    assert prompts.subagent_prompt("CHUNK", "Q?").count("CHUNK") == 1
    assert '{"evidence": "...", "answer": "..."}' in prompts.subagent_prompt("CHUNK", "Q?")  # {{ }} escapes


def test_missing_checkout_names_the_file_and_what_to_clone(tmp_path, monkeypatch, qwen3_5_tokenizer):
    monkeypatch.delenv(release.REPO_ENV, raising=False)
    with pytest.raises(FileNotFoundError, match=r"git clone https://github.com/cuhk-parser/PARSER.*protocol_release.repo"):
        release.load_release_prompts(None)
    with pytest.raises(FileNotFoundError, match=r"train/scripts/prompt\.py not found.*git clone https://github.com/cuhk-parser/PARSER"):
        release.load_release_prompts(str(tmp_path / "empty"))
    repo = write_release_standin(tmp_path / "PARSER")
    (repo / "train/scripts/parser_agent_loop.py").unlink()
    with pytest.raises(FileNotFoundError, match=r"parser_agent_loop\.py not found"):
        release.load_release_prompts(str(repo))
    with pytest.raises(FileNotFoundError, match="prompt.py not found"):
        EpisodeEngine(None, None, ScriptedSubagents(), release_config(str(tmp_path / "no"))).query_agents(
            release_chunks("Document 1:\nx", qwen3_5_tokenizer, 64), "d")


def test_a_changed_user_turn_or_missing_constant_is_refused(tmp_path):
    repo = write_release_standin(tmp_path / "PARSER")
    path = repo / "train/scripts/prompt.py"
    path.write_text(path.read_text().replace("## Question", "# Question"))
    with pytest.raises(ValueError, match="LEAD_AGENT_USER_PROMPT"):
        release.load_release_prompts(str(repo))
    path.write_text("X = 1\n")
    with pytest.raises(ValueError, match="no literal assignment to LEAD_AGENT_USER_PROMPT"):
        release.load_release_prompts(str(repo))


def test_the_project_carries_no_release_prose():
    # the project's own files, committed or not (git's view: no walk through .venv/ or outputs/)
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    paths = [ROOT / name for name in listed if Path(name).suffix in {".py", ".txt", ".json", ".yaml", ".md", ".jinja"}]
    texts = {p: p.read_text(errors="ignore") for p in paths if p.is_file() and p != Path(__file__).resolve()}
    assert len(texts) > 300  # the whole tree was listed
    for phrase in ("DO NOT GIVE UP EASILY", "precise document analysis assistant", "Broadcast a query to all document agents",
                   "start with a short Thinking section"):
        assert not [p for p, text in texts.items() if phrase in text], phrase


# --- row: training reward (normaliser) ---

def _release_normalize(text: str) -> str:
    """The release's training normaliser, restated: lower, articles -> space, then [^\\w\\s], then spaces."""
    if not text:
        return ""
    text = re.sub(r"\b(a|an|the)\b", " ", text.lower())
    return " ".join(re.sub(r"[^\w\s]", "", text).split())


@pytest.mark.parametrize("text,theirs,ours", [
    ("The Eiffel Tower.", "eiffel tower", "eiffel tower"),
    ("a.b", "b", "ab"),                        # articles go before punctuation
    ("¿Qué pasó?", "qué pasó", "¿qué pasó"),      # Unicode punctuation
    ("rock_and_roll", "rock_and_roll", "rockandroll"),  # "_" is a word character
    ("An–the", "", "–"),
    ("", "", ""),
])
def test_release_normaliser_differs_where_the_issue_says(text, theirs, ours):
    assert release_normalize(text) == theirs == _release_normalize(text)
    assert normalize_answer(text) == ours


def test_release_normaliser_matches_its_rules_on_generated_strings():
    rng = random.Random(12)
    pieces = ["the", "a", "an", "The", "A.", "x", "Zoë", "_", "-", "–", "¿", "'", ".", ",", "1,000", "é", " ", "  ", "\n", "an'"]
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(613)]
    assert all(release_normalize(t) == _release_normalize(t) for t in texts)
    assert sum(release_normalize(t) != normalize_answer(t) for t in texts) > 100


def test_release_exact_match():
    em = protocol_for(EpisodeConfig(protocol="release")).exact_match  # the training reward; needs no checkout
    assert em("a.b", ["B"]) == 1.0 and exact_match("a.b", ["B"]) == 0.0
    assert protocol_for(EpisodeConfig()).exact_match("a.b", ["B"]) == 0.0
    assert em("the", ["a"]) == 0.0  # the release's "" == "" quirk is not kept: empty golds never score
    assert em("", ["a"]) == 0.0
    assert em("Paris", ["", "paris"]) == 1.0  # falsy golds skipped
    assert em("Paris", "Paris!") == 1.0


# --- row: turn rules ---

def _xml(query: str, name: str = "query_agents") -> str:
    return f"<tool_call>\n<function={name}>\n<parameter=query>\n{query}\n</parameter>\n</function>\n</tool_call>"


def test_tool_calls_win_over_an_answer_and_thinking_is_searched():
    text = f"Let me look. {_xml('Who directed Zorvan?')}\n</think>\n\n<answer>Miro Tal</answer><|im_end|>"
    action = parse_release_turn(text)
    assert action.queries == ["Who directed Zorvan?"] and action.answer is None
    ours = parse_lead_output(text, ("query_agents",))
    assert ours.answer == "Miro Tal" and ours.queries == []  # parser: the answer after </think> wins


def test_answers_are_the_last_nonempty_block_anywhere_and_markers_are_stripped():
    assert parse_release_turn("<answer>a</answer> then <answer> b </answer><|im_end|><|endoftext|>").answer == "b"
    assert parse_release_turn("<answer>in thinking</answer>\n</think>\n\nno tags").answer == "in thinking"
    empty = parse_release_turn("done\n</think>\n\n<answer>  </answer>")
    assert empty.answer is None and empty.error  # invalid step
    assert parse_lead_output("done\n</think>\n\n<answer>  </answer>", ("query_agents",)).answer == ""  # parser: ends the episode
    assert release.strip_trailing_markers("x </answer> <|im_end|>\n<|endoftext|>  ") == "x </answer>"


def test_unusable_calls_are_valid_steps_answered_by_an_error():
    text = _xml("q1") + _xml("", "query_agents") + _xml("q2", "search") + \
        '<tool_call>{"name": "query_agents", "arguments": {"query": 7}}</tool_call>' + \
        '<tool_call>[{"function": {"name": "query_agents", "arguments": "{\\"query\\": \\" q3 \\"}"}}]</tool_call>' + \
        "<tool_call>" + _xml("never closed")[len("<tool_call>"):-len("</tool_call>")]
    action = parse_release_turn(text)
    assert action.error is None and action.answer is None
    assert action.queries == ["q1", "q3"]
    assert [(c.name, c.error) for c in action.calls] == [
        ("query_agents", None),
        ("query_agents", '{"error": "missing required argument \'query\'"}'),
        ("search", '{"error": "unknown tool \'search\', expected query_agents"}'),
        ("query_agents", '{"error": "invalid query type <class \'int\'>, expected str"}'),
        ("query_agents", None),
    ]
    assert parse_release_turn("no call, no answer").error


def test_xml_values_with_literal_escapes_and_json_values():
    action = parse_release_turn('<tool_call><function=query_agents>\\n<parameter=query>\\n"quoted"\\n</parameter>\\n</function></tool_call>')
    assert action.queries == ["quoted"]


# --- row: observation ---

REPLIES = [
    None,                                                                       # failed request
    "Unknown",                                                                  # abstention
    '```json\n{"evidence": "Zoë wrote “Lumen”.", "answer": "Zoë"}\n```',       # fenced
    'Sure: {"answer": "42", "evidence": "six times seven"} hope that helps',   # bare, key order of the release
    '{"evidence": "its origin is unknown", "answer": "n/a"}',                  # a stop string anywhere drops it
    "A long free-text reply with no JSON object in it at all, over sixty-four characters.",
    "short junk",
    '{"evidence": "", "answer": 0}',                                            # falsy fields: nothing to keep
    '{"evidence": "cut off", "answer": "Paris"',                                 # repaired
    '["a", "list"]',
]


class FixedReplies:
    """Chunk readers answering with one fixed reply per chunk; None: the request fails."""

    def __init__(self, replies):
        self.replies = replies

    async def read(self, query, chunk, doc_id):
        if self.replies[chunk.index] is None:
            raise BackendError("scripted failure", retryable=False)
        return ReaderReply(self.replies[chunk.index])


def observe(replies, config, tokenizer) -> tuple[str, int]:
    """(observation, findings) of one query_agents call over one chunk per reply: the real path
    (`EpisodeEngine.query_agents` -> `QueryAgents.scatter` -> the protocol's gather)."""
    chunks = [Chunk(i, f"chunk {i}", (i + 1,), 2) for i in range(len(replies))]
    engine = EpisodeEngine(None, tokenizer, FixedReplies(replies), config)
    record = asyncio.run(engine.query_agents(chunks, "d").scatter("q"))
    assert [c.status == "failed" for c in record.calls] == [r is None for r in replies]
    return record.observation, sum(1 + len(f.merged_agents) for f in record.findings)


def test_observation_is_the_release_json(release_repo, qwen3_5_tokenizer):
    text, n = observe(REPLIES, release_config(release_repo), qwen3_5_tokenizer)
    expected = {
        "agent_2": {"evidence": "Zoë wrote “Lumen”.", "answer": "Zoë"},
        "agent_3": {"evidence": "six times seven", "answer": "42"},
        "agent_5": {"raw_response": REPLIES[5]},
        "agent_8": {"evidence": "cut off", "answer": "Paris"},
    }
    assert (text, n) == (json.dumps(expected, indent=2, ensure_ascii=False), 4)
    assert text.startswith('{\n  "agent_2": {\n    "evidence": "Zoë wrote “Lumen”.",\n    "answer": "Zoë"\n  },')


def test_no_findings_is_the_fixed_message(release_repo, qwen3_5_tokenizer):
    config, tok = release_config(release_repo), qwen3_5_tokenizer
    assert observe([None, "Unknown", " unknown.", "ok"], config, tok) == ("No agents found relevant information for this query.", 0)
    assert observe(['{"answer": "Unknown person"}'], config, tok)[1] == 0  # case-sensitive, anywhere
    assert observe(['{"evidence": "UNKNOWN", "answer": "x"}'], config, tok)[1] == 1


def test_parser_protocol_keeps_todays_observation(qwen3_5_tokenizer):
    text, n = observe(REPLIES, EpisodeConfig(), qwen3_5_tokenizer)
    findings = []
    from parser.records.trajectory import Finding
    for i, reply in enumerate(REPLIES):
        if reply is not None and (parsed := parse_reply(reply)):
            findings.append(Finding(f"agent_{i}", i, *parsed))
    assert text == render_observation("q", findings, len(REPLIES), lambda _: 0, 4096)[0] and n == len(findings)


# --- row: chunk headers ---

def _release_chunks(document: str, tok, size: int) -> list[str]:
    """The release's chunking, restated from its rules."""
    parts = re.split(r"(?:^|\n)Document\s\d+:\s*", document)
    splits = [f"Paragraph {i}: {p.strip()}" for i, p in enumerate(parts) if p.strip()]
    counts = [len(tok.encode(s)) for s in splits]
    chunks, current, count = [], splits[0], counts[0]
    for split, n in zip(splits[1:], counts[1:], strict=True):
        if count + n < size:
            current, count = f"{current}\n\n{split}", count + n + 1
        else:
            chunks.append(current)
            current, count = split, n + 1
    return chunks + [current]


def test_chunk_headers_and_packing_follow_the_release(qwen3_5_tokenizer):
    tok = qwen3_5_tokenizer
    paragraphs = [f"Title {i}\nSentence {i} about Document 3: nothing." for i in range(1, 13)]
    paragraphs[4] = "Long\n" + " ".join(f"word{i}" for i in range(400))  # longer than a chunk: kept whole
    document = "Preamble line.\n\n" + render_paragraphs(paragraphs)
    chunks = protocol_for(EpisodeConfig(protocol="release", chunk_size=64)).chunk(document, tok)
    assert [c.text for c in chunks] == _release_chunks(document, tok, 64)
    assert chunks[0].text.startswith("Paragraph 0: Preamble line.\n\nParagraph 1: Title 1\n")
    (long,) = [c for c in chunks if "word399" in c.text]
    assert long.text.startswith("Paragraph 5: Long") and long.num_tokens > 64
    ours = chunk_document(document, tok, 64)  # parser: "Document {i}:" headers kept, long paragraphs split
    assert ours[0].text.startswith("Preamble line.\n\nDocument 1:\nTitle 1") and max(c.num_tokens for c in ours) <= 64


# --- the scripted episode: the stream the release's loop builds ---

QUESTION = "Who directed Zorvan?"
SCRIPT = [
    # 1: an answer in the thinking and two calls (one to an unknown tool): the calls win
    (f"Guess <answer>Someone</answer> first.\n</think>\n\n{_xml('Who directed Zorvan?')}\n{_xml('x', 'search')}", True),
    # 2: neither a call nor an answer -> the release's hint; mask by reward
    ("Hmm.\n</think>\n\nStill thinking about it.", True),
    # 3: an empty answer is invalid too
    ("Done.\n</think>\n\n<answer> </answer>", True),
    # 4: cut at the token limit (no end-of-turn token): the engine closes it, then the hint
    ("I wonder whether", False),
    # 5: the answer
    ("The agents agree.\n</think>\n\n<answer>Miro Tal</answer>", True),
]


class ScriptedSubagents:
    async def read(self, query, chunk, doc_id):
        if 2 in chunk.paragraph_ids:
            return ReaderReply('```json\n{"evidence": "Zorvan is a film directed by Miro Tal.", "answer": "Miro Tal"}\n```')
        return ReaderReply("Unknown")


def scripted(tok) -> ScriptedLead:
    """SCRIPT's turns as the lead's generations (closed: ended by <|im_end|>, else cut at the limit)."""
    return ScriptedLead(tok, [(text, "stop" if closed else "length") for text, closed in SCRIPT])


def _release_stream(tok, prompts, script, observations):
    """The release's loop, restated: template(messages) ids, each turn's generated ids, then the ids
    t1[len(t0)-1:] of the template after the tool/hint turn (an end-of-turn id first if the turn
    was cut); mask 1 on generated ids (-1 for invalid turns), 0 on the rest.

    The release renders with its own chat_template.jinja, which shows every assistant turn's
    thinking (the stock Qwen3.5 template drops it before the last user turn, so t1 would not
    extend t0 after a hint): the stock template with that one condition made always true."""
    stock = tok.chat_template
    assert stock.count("loop.index0 > ns.last_query_index") == 1
    release_template = stock.replace("loop.index0 > ns.last_query_index", "true")

    def ids(messages, gen):
        text = tok.apply_chat_template(messages, tools=prompts.tools, tokenize=False, add_generation_prompt=gen,
                                       enable_thinking=True, chat_template=release_template)
        return tok.encode(text, add_special_tokens=False)

    end = tok.convert_tokens_to_ids("<|im_end|>")
    messages = [{"role": "system", "content": prompts.lead_system}, {"role": "user", "content": f"## Question\n\n{QUESTION}\n"}]
    prompt = ids(messages, True)
    response, mask = [], []
    for (text, closed), observation in zip(script, observations, strict=True):
        out = tok.encode(text, add_special_tokens=False) + ([end] if closed else [])
        response += out
        content = re.sub(r"<tool_call>.*?</tool_call>", "", text, flags=re.S).strip()  # the whole turn, thinking included
        if observation is None:  # the answer
            mask += [1] * len(out)
            break
        if isinstance(observation, list):  # tool replies
            calls = [{"type": "function", "function": {"name": n, "arguments": {"query": q}}} for n, q, _ in observation]
            messages.append({"role": "assistant", "content": content or None, "tool_calls": calls})
            t0 = ids(messages, False)
            messages += [{"role": "tool", "name": n, "content": c} for n, _, c in observation]
            mask += [1] * len(out)
        else:  # the invalid-step hint
            messages.append({"role": "assistant", "content": content})
            t0 = ids(messages, False)
            messages.append({"role": "user", "content": observation})
            mask += [-1] * len(out)
        t1 = ids(messages, True)
        assert t1[: len(t0)] == t0
        env = t1[len(t0) - 1:]
        assert env[0] == tok.encode("\n")[0]
        env = env if out[-1] == end else [end] + env
        response += env
        mask += [0] * len(env)
    return prompt, response, mask


@pytest.fixture(scope="module")
def release_episode(release_repo, qwen3_5_tokenizer):
    tok = qwen3_5_tokenizer
    paragraphs = [f"Filler {i}\nNothing about films here, only weather number {i}." for i in range(1, 7)]
    paragraphs[1] = "Zorvan\nZorvan is a film directed by Miro Tal."
    config = release_config(release_repo, chunk_size=30)
    chunks = protocol_for(config).chunk(render_paragraphs(paragraphs), tok)
    lead = scripted(tok)
    trajectory = asyncio.run(EpisodeEngine(lead, tok, ScriptedSubagents(), config).run(QUESTION, chunks, doc_id="d0"))
    return trajectory, chunks, tok, release.load_release_prompts(release_repo)


def test_scripted_episode_builds_the_release_stream(release_episode):
    trajectory, chunks, tok, prompts = release_episode
    finding = next(c.index for c in chunks if 2 in c.paragraph_ids)
    observation = json.dumps({f"agent_{finding}": {"evidence": "Zorvan is a film directed by Miro Tal.", "answer": "Miro Tal"}},
                             indent=2, ensure_ascii=False)
    observations = [
        [("query_agents", "Who directed Zorvan?", observation), ("search", "x", '{"error": "unknown tool \'search\', expected query_agents"}')],
        prompts.invalid_hint, prompts.invalid_hint, prompts.invalid_hint, None,
    ]
    prompt, response, mask = _release_stream(tok, prompts, SCRIPT, observations)
    assert trajectory.prompt_ids == prompt
    assert tok.decode(trajectory.response_ids) == tok.decode(response)
    assert trajectory.response_ids == response
    assert trajectory.answer == "Miro Tal" and trajectory.stop_reason == "answer"
    # the release's mask rule: invalid turns train only in a failed episode
    for reward, invalid in ((1.0, 0), (0.0, 1)):
        trajectory_mask = list(trajectory.response_mask)
        protocol_for(release_config("unused")).mask_invalid_turns(trajectory, reward)
        assert trajectory.response_mask == [invalid if m == -1 else m for m in mask]
        trajectory.response_mask = trajectory_mask
    assert [t.action_error is None for t in trajectory.turns] == [True, False, False, False, True]


def test_release_answer_is_the_last_answer_of_the_whole_completion(release_repo, qwen3_5_tokenizer):
    tok = qwen3_5_tokenizer
    chunks = release_chunks("Document 1:\nZorvan is a film directed by Miro Tal.", tok, 64)
    config = release_config(release_repo, max_turns=2)
    trajectory = asyncio.run(EpisodeEngine(scripted(tok), tok, ScriptedSubagents(), config).run(QUESTION, chunks))
    assert trajectory.stop_reason == "max_turns" and trajectory.answer == "Someone"  # from turn 1's thinking


def test_release_turns_use_the_full_budget_until_the_response_is_spent(release_repo, qwen3_5_tokenizer):
    """The release gives every turn max_new_tokens while the response is under its length (and cuts
    the trajectory afterwards); the parser protocol shrinks the last turn's budget to what is left."""
    tok = qwen3_5_tokenizer
    chunks = release_chunks("Document 1:\nZorvan.", tok, 64)

    def run(protocol_name, max_turns, max_response_tokens):
        config = EpisodeConfig(protocol=protocol_name, protocol_release={"repo": release_repo}, max_tokens_per_turn=50,
                               max_turns=max_turns, max_response_tokens=max_response_tokens)
        engine = EpisodeEngine(scripted(tok), tok, ScriptedSubagents(), config)
        budgets = []
        engine._turn = _recording(engine._turn, budgets)
        return asyncio.run(engine.run(QUESTION, chunks)), budgets

    first_turn = len(run("release", 1, None)[0].response_ids)
    trajectory, budgets = run("release", 9, first_turn + 10)
    assert budgets == [50, 50] and trajectory.stop_reason == "response_length"
    assert run("parser", 9, first_turn + 10)[1][:1] == [50]


def _recording(turn, budgets):
    async def wrapped(context, prompt, index, budget, *args):
        budgets.append(budget)
        return await turn(context, prompt, index, budget, *args)
    return wrapped


def test_subagent_reads_the_release_prompt_on_the_real_template(release_repo, qwen3_5_tokenizer):
    tok = qwen3_5_tokenizer
    (chunk,) = release_chunks("Document 1:\nZorvan is a film.", tok, 64)
    reader = SubagentReader(backend=None, tokenizer=tok, protocol=protocol_for(release_config(release_repo)))
    content = release.load_release_prompts(release_repo).subagent.format(chunk_content=chunk.text, question="Who?")
    assert reader.prompt("Who?", chunk) == tok.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                                                   add_generation_prompt=True, enable_thinking=False)


# --- the release's loop, where it ends a turn or an episode differently (rows 7, 9 and the token view) ---

def _episode(tok, repo, turns, protocol_name, **settings):
    config = EpisodeConfig(protocol=protocol_name, protocol_release={"repo": repo}, **settings)
    chunks = protocol_for(config).chunk("Document 1:\nZorvan\nZorvan is a film directed by Miro Tal.\n\nDocument 2:\nB\nRain.", tok)
    lead = ScriptedLead(tok, [], ids=turns)  # (token ids, finish reason) per turn, as verl's server manager returns them
    return asyncio.run(EpisodeEngine(lead, tok, ScriptedSubagents(), config).run(QUESTION, chunks, doc_id="d")), lead


def _turn(tok, text, end="<|im_end|>"):
    return tok.encode(text, add_special_tokens=False) + ([tok.convert_tokens_to_ids(end)] if end else []), "stop" if end else "length"


def test_an_answer_that_says_no_answer_found_is_an_invalid_step(release_repo, qwen3_5_tokenizer):
    """The release's `extract_answer` returns "No answer found" for no answer and its loop tests
    `!= "No answer found"`: an answer block saying exactly that is no answer, the turn gets the hint."""
    tok = qwen3_5_tokenizer
    assert parse_release_turn("I give up.\n</think>\n\n<answer> No answer found </answer>").answer is None
    assert parse_release_turn("<answer>No answer found here</answer>").answer == "No answer found here"
    turns = [_turn(tok, "Nothing yet.\n</think>\n\n<answer>No answer found</answer>"),
             _turn(tok, "Now I know.\n</think>\n\n<answer>Miro Tal</answer>")]
    released, lead = _episode(tok, release_repo, turns, "release")
    assert (released.answer, released.num_turns, released.turns[0].action_error is not None) == ("Miro Tal", 2, True)
    hint = protocol_for(release_config(release_repo)).invalid_hint()
    assert [m["content"] for m in released.messages if m["role"] == "user"][-1] == hint
    ours, _ = _episode(tok, release_repo, turns, "parser")
    assert (ours.answer, ours.num_turns) == ("No answer found", 1)  # this project: an answer ends the episode


def test_a_generation_of_no_tokens_ends_the_release_episode(release_repo, qwen3_5_tokenizer):
    """The release's loop: `if not out_toks: break` — nothing appended, the episode is over."""
    tok = qwen3_5_tokenizer
    turns = [_turn(tok, f"Ask.\n</think>\n\n{_xml('Who directed Zorvan?')}"), ([], "stop"),
             _turn(tok, "</think>\n\n<answer>Miro Tal</answer>")]
    released, lead = _episode(tok, release_repo, turns, "release")
    assert (released.stop_reason, released.num_turns, released.answer, len(lead.prompts)) == ("empty_generation", 1, None, 2)
    stream = released.prompt_ids + released.response_ids
    assert stream == lead.prompts[1]  # turn 1 and its observation, nothing after
    ours, lead = _episode(tok, release_repo, turns, "parser")
    assert (ours.stop_reason, ours.num_turns, ours.answer) == ("answer", 3, "Miro Tal")  # an invalid step, then on
    assert ours.turns[1].action_error is not None


def test_the_answer_turn_is_left_as_generated_under_release(release_repo, qwen3_5_tokenizer):
    """The release appends nothing after the answer turn (`break`); its other turns, when they do
    not end on the tokenizer's eos (<|im_end|> for Qwen3.5), get one before the observation. This
    project closes every turn, so its answer turn ended by <|endoftext|> gets a mask-0 <|im_end|>."""
    tok = qwen3_5_tokenizer
    im_end, eot = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    assert tok.eos_token_id == im_end  # the id the release's `_template_diff_token_append` prepends
    turns = [_turn(tok, f"Ask.\n</think>\n\n{_xml('Who directed Zorvan?')}", end="<|endoftext|>"),
             _turn(tok, "</think>\n\n<answer>Miro Tal</answer>", end="<|endoftext|>")]
    for name, tail_ids, tail_mask in (("release", [eot], [1]), ("parser", [eot, im_end], [1, 0])):
        trajectory, lead = _episode(tok, release_repo, turns, name)
        assert trajectory.answer == "Miro Tal"
        assert trajectory.response_ids[-len(tail_ids):] == tail_ids and trajectory.response_mask[-len(tail_mask):] == tail_mask
        first = len(lead.prompts[0]) - len(trajectory.prompt_ids) + len(turns[0][0])
        assert trajectory.response_ids[first - 1: first + 1] == [eot, im_end]  # the tool turn is closed, in both


# --- row 6: a reply cut at the subagent's token cap is repaired as the release repairs it ---

def _release_kept(reply: str):
    """The release's `_parse_response` and `query_all`, restated: its two regexes pick the body,
    `json_repair.loads` reads it (unbounded), falsy fields go, a failure over 64 characters is
    passed on as raw_response; a stop string would have stopped (and dropped) the generation."""
    import json_repair

    if any(stop in reply for stop in release.STOP_STRINGS):
        return None
    fence = re.search(r"```json\s*(.*?)\s*```", reply, re.DOTALL)
    body = fence.group(1) if fence else (m.group(0) if (m := re.search(r"\{.*\}", reply, re.DOTALL)) else reply)
    try:
        parsed = json_repair.loads(body)
        kept = {k: parsed.get(k) for k in ("evidence", "answer") if parsed.get(k)}
    except Exception:
        kept = {"raw_response": reply.strip()} if len(reply.strip()) > 64 else {}
    return kept or None


def _cut_replies(tok, count: int, cap: int = 512) -> list[str]:
    """Replies that quote several paragraphs of the synthetic world, each sentence followed by a
    citation in brackets as quoted encyclopedia text carries them, longer than `cap` tokens and
    cut there — what the subagent's `max_tokens` leaves (key order and fences vary)."""
    from data_prep.synthetic_world import synthetic_rows

    rows = synthetic_rows(16, seed=3, num_paragraphs=300)[0]
    sentences = [s.strip() for r in rows for paragraph in r["metadata"]["context"]["content"] for s in paragraph]
    rng, replies = random.Random(5), []
    while len(replies) < count:
        quote = " ".join(f"{s[:-1]} ([{rng.randint(1, 40)}])." for s in rng.sample(sentences, rng.randint(8, 30)))
        finding = {"evidence": quote, "answer": rng.choice(sentences).split(" (")[0]}
        text = json.dumps(finding, ensure_ascii=False, indent=rng.choice([None, 2]))
        text = rng.choice(["```json\n{}\n```", "{}", "Found it:\n{}"]).format(text)
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) > cap:
            replies.append(tok.decode(ids[:cap]))
    return replies


def test_cut_replies_are_repaired_into_fields_as_the_release_does(qwen3_5_tokenizer):
    from parser.text.lenient_json import REPAIR_BUDGET

    replies = _cut_replies(qwen3_5_tokenizer, 120)
    expensive = [r for r in replies if len(r) * (1 + sum(r.count(c) for c in "{[(")) > REPAIR_BUDGET]
    assert len(expensive) > 30  # past json-repair's budget: these were shown as raw_response
    kept, theirs = [parse_release_reply(r) for r in replies], [_release_kept(r) for r in replies]
    assert all(k and "raw_response" not in k for k in kept)
    # field for field; json-repair's string-end heuristics keep or drop a trailing comma of the cut
    # string by context (open brackets, commas before it), which only json-repair itself reproduces
    same = sum(k == t for k, t in zip(kept, theirs, strict=True))
    assert same >= 0.95 * len(replies)
    unfinished = [({f: v.rstrip(",") for f, v in k.items()}, {f: v.rstrip(",") for f, v in t.items()}) for k, t in zip(kept, theirs, strict=True)]
    assert all(k == t for k, t in unfinished)


def test_an_escaped_surrogate_pair_is_its_character_and_a_lone_one_is_replaced():
    cut = '```json\n{"evidence": "smiles \\ud83d\\ude00, then \\ud800 alone", "answer": "\\ud83d\\ude00'
    assert parse_release_reply(cut) == {"evidence": "smiles \U0001F600, then \ufffd alone", "answer": "\U0001F600"}
    json.dumps(parse_release_reply(cut), ensure_ascii=False).encode()  # encodable: no lone surrogate is left
    assert parse_reply('{"answer": "\\ud83d\\ude00 \\udc00", "evidence": "e"}') == ("\U0001F600 \ufffd", "e")


# --- row: eval Sub_EM ---

@pytest.mark.parametrize("completion,golds,expected", [
    ("<answer>Paris</answer>", ["Paris"], 1.0),
    ("I think it is **Paris**.\n</think>\n\nno tags", ["Paris"], 1.0),        # bold fallback, thinking included
    ("<answer>London</answer> but **Paris**", ["Paris"], 1.0),                 # max of the two
    ("nothing", ["answer"], 1.0),                                              # missing = "No answer found"
    ("nothing", ["Paris"], 0.0),
    ("**.**", ["Paris"], 1.0),                                                 # "" is in every gold (reference quirk)
    ("<answer>Paris</answer>\n**London**", ["Paris"], 1.0),
    ("<answer>Berlin</answer> **.**", ["The"], 0.0),                           # a gold that normalizes to "" never scores
])
def test_release_sub_em(completion, golds, expected):
    assert release_sub_em(completion, golds) == expected


def test_eval_rows_carry_both_sub_ems():
    from parser.records.metrics import completion_text, score
    from parser.records.trajectory import Trajectory, Turn

    def turn(i: int, text: str) -> Turn:
        return Turn(index=i, text=text, thinking="", queries=[], answer=None, action_error="no action",
                    lead_tokens=4, finish_reason="stop", lead_latency_s=0.0)

    trace = Trajectory("Who?", "d", 1, turns=[turn(0, "Maybe **Miro Tal**.<|im_end|>"), turn(1, "no answer")])
    row = score(None, ["Miro Tal"], completion_text(trace))
    assert row["sub_em"] == 0.0 and row["sub_em_release"] == 1.0
    assert score("Miro Tal", ["Miro Tal"])["sub_em_release"] == 1.0  # baselines: scored on the answer


# --- row: data ---

def test_released_training_parquet_loads_unchanged(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from data_prep.verl_parquet import read_rl_parquet, rl_row
    from parser.records.rl_rows import episode_inputs

    released = {"data_source": "hotpotqa", "prompt": [{"role": "user", "content": "Who directed Zorvan?"}],
                "context": "Document 1:\nZorvan is a film directed by Miro Tal.", "ability": "memory",
                "reward_model": {"style": "rule", "ground_truth": ["Miro Tal"]}, "extra_info": {"index": 3, "split": "train"}}
    path = tmp_path / "release.parquet"
    pq.write_table(pa.Table.from_pylist([released]), path)
    (inputs,) = read_rl_parquet(path)
    assert (inputs.question, inputs.context, list(inputs.answers), inputs.id) == (
        "Who directed Zorvan?", released["context"], ["Miro Tal"], "3")
    # verl hands `prompt` over as raw_prompt, other columns as they are
    row = {k: v for k, v in released.items() if k != "prompt"} | {"raw_prompt": released["prompt"]}
    assert episode_inputs(row) == inputs
    ours = rl_row({"question": "Q?", "answers": ["Anna"], "context": "Document 1:\nA.", "index": 0, "id": "x", "num_docs": 1}, "hotpotqa")
    assert episode_inputs(ours).context == "Document 1:\nA."


def test_hotpotqa_eval_reads_what_the_memagent_eval_recipe_writes():
    recipe = yaml.safe_load((ROOT / "configs/data/memagent_eval.yaml").read_text())
    dataset = yaml.safe_load((ROOT / "configs/eval/dataset/hotpotqa.yaml").read_text())
    assert Path(dataset["path"]).parent == Path(recipe["out_dir"])
    assert Path(dataset["path"]).name == "eval_{length}.json" and dataset["lengths"] == recipe["lengths"]


# --- presets ---

def test_parser_release_eval_preset_composes(release_repo, monkeypatch):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    monkeypatch.setenv(release.REPO_ENV, release_repo)
    with initialize_config_dir(config_dir=str(ROOT / "configs/eval"), version_base=None):
        cfg = compose(config_name="default", overrides=[f"hydra.searchpath=[file://{ROOT / 'configs'}]", "method=parser_release"])
    episode = EpisodeConfig(**OmegaConf.to_container(cfg.method.episode, resolve=True))
    assert (episode.protocol, episode.protocol_release["repo"], episode.max_turns) == ("release", release_repo, 16)
    assert (episode.chunk_size, episode.lead_temperature, episode.max_tokens_per_turn, episode.lead_thinking) == (4096, 0.0, 2048, True)
    assert (episode.subagent_temperature, episode.subagent_max_tokens) == (0.7, 512)
    assert cfg.models.lead.model == "inNexus/parser-qwen35-4b" and cfg.method.name == "parser_release"


def test_eval_run_feeds_release_subagents_the_releases_paragraph_chunks(release_repo, monkeypatch):
    """`python -m eval.run --config-name tiny_cpu method=parser_release`, as eval.run builds it
    (`build_eval_method`: tiny in-process models, the stand-in checkout): every subagent prompt
    carries one of the release's `Paragraph N:` chunks, and together they are the whole document
    as the release chunks it. Only the lead is replaced, by one scripted query then an answer: a
    random-weight lead rarely calls the tool, and what it says is not under test here."""
    from hydra import compose, initialize_config_dir

    from eval.datasets import load_subsets
    from eval.run import build_eval_method

    monkeypatch.setenv(release.REPO_ENV, release_repo)
    with initialize_config_dir(config_dir=str(ROOT / "configs/eval"), version_base=None):
        cfg = compose(config_name="tiny_cpu", overrides=[f"hydra.searchpath=[file://{ROOT / 'configs'}]", "method=parser_release",
                                                          "method.episode.subagent_max_tokens=4", "method.episode.chunk_size=2048"])
    method = build_eval_method(cfg)
    tok = method.models.lead_tokenizer
    method.engine.lead = ScriptedLead(tok, [], ids=[_turn(tok, f"</think>\n\n{_xml('Who?')}"), _turn(tok, "</think>\n\n<answer>x</answer>")])
    seen = []
    subagent = method.models.subagent
    generate = subagent.generate

    async def recording(prompt, sampling, **kwargs):
        seen.append((kwargs["routing_key"], prompt))
        return await generate(prompt, sampling, **kwargs)

    monkeypatch.setattr(subagent, "generate", recording)
    (sample,) = load_subsets({**dict(cfg.dataset), "num_questions": 1, "lengths": [50]})[0].samples
    result = asyncio.run(method.run(sample))
    asyncio.run(method.aclose())
    chunks = release_chunks(sample.context, method.models.subagent_tokenizer, 2048)
    assert result.trace.num_chunks == len(chunks) > 1
    assert sorted(key for key, _ in seen) == sorted(f"{sample.id}:{c.index}" for c in chunks)
    for key, prompt in seen:
        chunk = chunks[int(key.rsplit(":", 1)[1])]
        assert chunk.text.startswith(f"Paragraph {chunk.paragraph_ids[0]}: ") and chunk.text in prompt
        assert "STAND-IN subagent prompt" in prompt and "Document 1:\n" not in prompt


def test_release_training_preset_and_loss_aggregations():
    pytest.importorskip("verl")
    from hydra import compose, initialize_config_dir

    from parser.train.config_checks import TrainConfigError, check_train_config
    from parser.train.train import CONFIG_DIR, prepare

    def load(name, *extra):
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None):
            return compose(config_name=name, overrides=["parser.gateway_url=http://127.0.0.1:30000", *extra])

    cfg = prepare(load("train/parser_4b_release"))
    actor = cfg.actor_rollout_ref.actor
    assert (actor.loss_agg_mode, actor.optim.lr_warmup_steps) == ("token-mean", 70)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (840, 8192)
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == 2
    assert cfg.parser.episode.protocol == "release" and cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "parser_agent"
    assert (cfg.parser.episode.max_turns, cfg.parser.episode.max_tokens_per_turn, cfg.parser.episode.chunk_size) == (9, 2048, 512)
    check_train_config(load("train/parser_4b", "actor_rollout_ref.actor.loss_agg_mode=token-mean"))
    with pytest.raises(TrainConfigError, match=r"seq-mean-token-mean \(the paper's objective, Eq. 1.*token-mean \(verl's default, what the authors"):
        check_train_config(load("train/parser_4b", "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum"))


# --- the release's training rules inside verl's own rollout worker (tests/verl_fakes.py) ---

def test_verl_worker_trains_released_rows_with_the_release_mask(release_repo, tiny_qwen3_5_model, tiny_tokenizer, tmp_path):
    """Released-layout rows (top-level `context`, question in prompt[0], no agent_name) through
    verl's AgentLoopWorker under protocol=release: the release's EM decides the reward, and the
    invalid middle turn trains (mask 1) only in the trajectory rewarded 0."""
    pytest.importorskip("verl")
    from verl_fakes import CALL, ScriptedServerManager, document, run_verl_worker, save_tiny_model, train_config

    from parser.serving.loopback import start_loopback
    from parser.train.reward import ANSWER_KEY

    invalid = ("Let me think.\n</think>\n\nNo tags here.", "stop")
    right = [("I need the director.\n</think>\n\n" + CALL.format("Who directed the film Zorvan?"), "stop"), invalid,
             ("Found.\n</think>\n\n<answer>a.Miro Tal</answer>", "stop")]  # release EM only: articles go first

    wrong = [right[0], invalid, ("Guess.\n</think>\n\n<answer>Anna Berg</answer>", "stop")]
    question = "Who directed the film Zorvan?"
    row = {"data_source": "hotpotqa", "raw_prompt": [{"role": "user", "content": question}], "context": document(),
           "ability": "memory", "reward_model": {"style": "rule", "ground_truth": ["Miro Tal"]}, "extra_info": {"index": 0}}
    model_dir = save_tiny_model(tiny_qwen3_5_model, tiny_tokenizer, str(tmp_path / "lead"))
    with start_loopback("subagent-w1", needle="directed by Miro Tal", needle_answer="Miro Tal") as loopback:
        config = train_config(loopback.url, model_dir, [
            "parser.episode.protocol=release", f"parser.episode.protocol_release.repo={release_repo}",
            "actor_rollout_ref.rollout.agent.default_agent_loop=parser_agent"])
        manager = ScriptedServerManager(tiny_qwen3_5_model, tiny_tokenizer, scripts=[right, wrong])
        out = run_verl_worker(config, manager, [row, row])
    assert sorted(out.non_tensor_batch[ANSWER_KEY]) == ["Anna Berg", "a.Miro Tal"]
    for i in range(len(out)):
        reward = out.batch["rm_scores"][i].sum().item()
        script = right if out.non_tensor_batch[ANSWER_KEY][i] == "a.Miro Tal" else wrong
        assert reward == (1.0 if script is right else 0.0)
        sizes = [len(tiny_tokenizer.encode(text, add_special_tokens=False)) + 1 for text, _ in script]
        trained = int(out.batch["response_mask"][i].sum().item())
        assert trained == sizes[0] + sizes[2] + (sizes[1] if reward < release.INVALID_MASK_REWARD else 0)
        assert f"## Question\n\n{question}" in tiny_tokenizer.decode(out.batch["prompts"][i].tolist())


def test_release_protocol_is_refused_for_other_tool_sets(release_repo):
    class Search:
        names = ("search",)

    engine = EpisodeEngine(None, None, None, release_config(release_repo))
    with pytest.raises(ValueError, match="query_agents protocol"):
        asyncio.run(engine.run_tools("q", Search()))
    with pytest.raises(ValueError, match="protocol must be one of parser, release"):
        EpisodeConfig(protocol="authors")
