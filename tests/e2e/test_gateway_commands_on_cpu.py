"""Serve configs -> command lines: every shipped config composes, and the commands carry the
settings the subagent gateway depends on (checked against the installed sglang-router's own
argument parser where one is installed). Starts no model and no router.

    .venv/bin/pytest tests/e2e/test_gateway_commands_on_cpu.py -q
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from parser.backends.base import ROUTING_HEADER
from parser.gateway import (Gateway, flags, router_launch, routing_header,
                            worker_launches)

ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIGS = ROOT / "configs" / "serve"


def _config(name: str, overrides: list[str] = ()) -> dict:
    with initialize_config_dir(str(SERVE_CONFIGS), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name=name, overrides=list(overrides)), resolve=True)


def _value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def _router_args(argv: list[str]):
    """Parse a router command line with the installed sglang-router's own parser."""
    router_args = pytest.importorskip("sglang_router.router_args")
    import argparse

    parser = argparse.ArgumentParser()
    router_args.RouterArgs.add_cli_args(parser, use_router_prefix=False)
    for action in parser._actions:  # the same widening parser.gateway's shim does
        if action.dest == "policy":
            action.choices = [*action.choices, "consistent_hashing", "prefix_hash"]
    start = argv.index("--worker-urls")
    return parser.parse_args(argv[start:])


@pytest.mark.parametrize("name", sorted(p.stem for p in SERVE_CONFIGS.glob("*.yaml")))
def test_every_serve_config_composes_into_commands(name):
    cfg = _config(name)
    gateway = Gateway.from_config(cfg)
    assert len(gateway.workers) == cfg["workers"]["num"]
    for launch in gateway.launches():
        assert "0.0.0.0" not in launch.argv, f"{name}: {launch.name} binds all interfaces"
        assert launch.url.startswith("http://127.0.0.1:")
    args = _router_args(gateway.router.argv)
    assert args.worker_urls == [w.url for w in gateway.workers]
    assert args.host == "127.0.0.1" and args.prometheus_host == "127.0.0.1"
    assert args.policy == cfg["router"]["policy"]


def test_subagent_workers_get_the_qwen35_subagent_settings():
    cfg = _config("default")
    workers = worker_launches(cfg["workers"])
    gpus = [w.env["CUDA_VISIBLE_DEVICES"] for w in workers]
    assert len(set(gpus)) == len(gpus) == 8
    argv = workers[0].argv
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    assert _value(argv, "--schedule-policy") == "lpm"
    assert _value(argv, "--mamba-scheduler-strategy") == "extra_buffer"
    assert json.loads(_value(argv, "--default-chat-template-kwargs")) == {"enable_thinking": False}
    assert json.loads(_value(argv, "--preferred-sampling-params")) == {"temperature": 0.7, "max_new_tokens": 512}
    assert "--enable-metrics" in argv and "--enable-cache-report" in argv
    assert "--tool-call-parser" not in argv  # subagents answer JSON; tool parsing is the lead's


def test_cache_aware_router_knobs_reach_the_command():
    cfg = _config("default", ["router.args.cache_threshold=0.5", "router.args.tokenizer_path=/models/qwen"])
    launch = router_launch(cfg["router"], ["http://127.0.0.1:30001", "http://127.0.0.1:30002"])
    assert launch.argv[1:3] == ["-m", "sglang_router.launch_router"]
    args = _router_args(launch.argv)
    assert (args.cache_threshold, args.balance_abs_threshold, args.balance_rel_threshold) == (0.5, 64, 1.5)
    assert args.tokenizer_path == "/models/qwen"
    assert args.prometheus_port == 29000 and launch.metrics_url == "http://127.0.0.1:29000"
    assert routing_header("cache_aware") is None


def test_lead_and_yarn_configs():
    lead = worker_launches(_config("lead")["workers"])[0].argv
    assert _value(lead, "--tool-call-parser") == "qwen3_coder"
    assert _value(lead, "--reasoning-parser") == "qwen3"
    assert "--default-chat-template-kwargs" not in lead  # the lead thinks

    yarn_cfg = _config("yarn_full_context")
    yarn = worker_launches(yarn_cfg["workers"])
    rope = json.loads(_value(yarn[0].argv, "--json-model-override-args"))["text_config"]["rope_parameters"]
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 262144)
    assert int(_value(yarn[0].argv, "--context-length")) > 262144
    assert _value(yarn[0].argv, "--tp-size") == "4"
    assert [w.env["CUDA_VISIBLE_DEVICES"] for w in yarn] == ["0,1,2,3", "4,5,6,7"]
    assert yarn[0].env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1"


def test_header_keyed_policy_goes_through_the_shim_only_when_needed():
    from parser.gateway import _installed_launcher_policies

    pytest.importorskip("sglang_router", reason="needs the gateway extra: pip install 'parser-agents[gateway]'")
    choices = _installed_launcher_policies()
    cfg = _config("default", ["router.policy=consistent_hashing"])
    launch = router_launch(cfg["router"], ["http://127.0.0.1:30001"])
    if "consistent_hashing" in choices:  # a newer launcher takes it directly
        assert launch.argv[1:3] == ["-m", "sglang_router.launch_router"]
    else:  # 0.3.2: the Rust core has it, the argparse choices do not
        assert launch.argv[1:4] == ["-m", "parser.gateway", "router"]
    assert _router_args(launch.argv).policy == "consistent_hashing"
    assert routing_header("consistent_hashing") == routing_header("manual") == ROUTING_HEADER == "X-SMG-Routing-Key"
    smg = router_launch({**cfg["router"], "kind": "smg"}, ["http://127.0.0.1:30001"])
    assert smg.argv[1] == "launch" and Path(smg.argv[0]).name == "smg"


def test_flags_spell_values_like_the_servers_expect():
    assert flags({"enable_metrics": True, "disable_x": False, "tokenizer_path": None,
                  "kw": {"a": 1}, "urls": ["u1", "u2"], "n": 3}) == [
        "--enable-metrics", "--kw", '{"a":1}', "--urls", "u1", "u2", "--n", "3"]
    with pytest.raises(ValueError, match="router.args"):
        flags({"": 1}, "router.args")


def test_bad_worker_config_is_named():
    with pytest.raises(ValueError, match="workers.kind"):
        worker_launches({"kind": "vllm"})
    with pytest.raises(ValueError, match="workers.model_path"):
        worker_launches({"kind": "sglang", "num": 1})
    with pytest.raises(ValueError, match="workers.ports"):
        worker_launches({"kind": "loopback", "num": 2, "ports": [1]})


def test_serve_script_dry_run_prints_commands_and_starts_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "serve_subagents.py"), "dry_run=true", "workers.num=2",
         f"hydra.run.dir={tmp_path}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert [line.split("]")[0][1:] for line in lines] == ["worker0", "worker1", "router"]
    assert "CUDA_VISIBLE_DEVICES=1 " in lines[1] and "--port 30002" in lines[1]
    assert not list(tmp_path.glob("worker*.log")) and not (tmp_path / "router.log").exists()  # nothing started


def test_report_flags_instructions_that_would_swamp_cache_aware():
    """cache_aware follows a tree only above `cache_threshold` (0.3) of the text: with short
    chunks the shared instructions alone pass it and every chunk lands on one worker (measured:
    64 chunks of 25 words -> all on one of 3 workers; 300 words -> spread 1.02)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gateway_report", ROOT / "scripts" / "gateway_report.py")
    report = importlib.util.module_from_spec(spec)
    sys.modules["gateway_report"] = report
    spec.loader.exec_module(report)
    assert report.instruction_share(report.Workload(chunk_words=25)) > 0.3
    assert report.instruction_share(report.Workload(chunk_words=300)) < 0.15
    prompts = report.subagent_prompts(report.Workload(chunks=3, chunk_words=50), 1)
    assert len(set(p[: p.rindex("Query:")] for p in prompts)) == 3  # one reusable prefix per chunk
    assert all(p.endswith(report.Workload().query(1)) for p in prompts)  # the query comes last
