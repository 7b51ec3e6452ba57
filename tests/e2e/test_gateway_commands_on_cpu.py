"""Serve configs -> command lines: every shipped config composes, with either router, into
commands whose every router flag (and choice value) the installed binary's own `--help` lists
(`python -m smg launch --help`, `python -m sglang_router.launch_router --help`), so a flag
renamed upstream fails here, not on a cluster. Starts no model and no router (only `--help`).

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

from parser.serving.types import ROUTING_HEADER
from parser.serving.gateway import (ROUTER_KINDS, Gateway, check_router_flags, flags, reads_routing_key, router_help,
                            router_launch, unknown_router_flags, worker_launches)

ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIGS = ROOT / "configs" / "serve"
CONFIG_NAMES = sorted(p.stem for p in SERVE_CONFIGS.glob("*.yaml"))


def _config(name: str, overrides: list[str] = ()) -> dict:
    with initialize_config_dir(str(SERVE_CONFIGS), version_base="1.3"):
        return OmegaConf.to_container(compose(config_name=name, overrides=list(overrides)), resolve=True)


def _value(argv: list[str], flag: str) -> str:
    assert flag in argv, f"{flag} missing from {argv}"
    return argv[argv.index(flag) + 1]


def test_both_routers_are_installed_by_the_project():
    assert set(ROUTER_KINDS) == {p.stem for p in (SERVE_CONFIGS / "router").glob("*.yaml")}
    for kind in ROUTER_KINDS:
        assert "--worker-urls" in router_help(kind)  # raises naming the extra when it is missing


@pytest.mark.parametrize("kind", ROUTER_KINDS)
@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_every_router_flag_of_every_serve_config_is_in_the_binarys_help(name, kind):
    cfg = _config(name, [f"router={kind}"])
    gateway = Gateway.from_config(cfg)
    assert gateway.router_kind == kind and len(gateway.workers) == cfg["workers"]["num"]
    argv = gateway.router.argv
    assert unknown_router_flags(argv, router_help(kind)) == [], f"{name} x {kind}"
    assert _value(argv, "--policy") == cfg["router"]["policy"]
    assert argv[argv.index("--worker-urls") + 1: argv.index("--policy")] == [w.url for w in gateway.workers]
    for launch in gateway.launches():
        assert "0.0.0.0" not in launch.argv, f"{name}: {launch.name} binds all interfaces"
        assert launch.url.startswith("http://127.0.0.1:")
    assert _value(argv, "--host") == _value(argv, "--prometheus-host") == "127.0.0.1"


@pytest.mark.parametrize("kind", ROUTER_KINDS)
def test_a_flag_the_binary_does_not_know_fails_before_anything_starts(kind, tmp_path):
    cfg = _config("default", [f"router={kind}", "workers._target_=parser.serving.gateway.module_worker", "workers.module=parser.serving.loopback", "workers.num=1", "workers.base_port=0",
                              f"log_dir={tmp_path}", "+router.args.routing_key_overide=true"])
    gateway = Gateway.from_config(cfg)
    with pytest.raises(ValueError, match="--routing-key-overide is not a flag"):
        gateway.start()
    assert not gateway.group.procs, "nothing may start when the router would refuse its flags"
    bad_choice = router_launch({**cfg["router"], "policy": "no_such_policy"}, ["http://127.0.0.1:1"])
    with pytest.raises(ValueError, match="--policy no_such_policy: expected one of"):
        check_router_flags(bad_choice, kind)


def test_smg_is_the_default_and_reads_the_routing_key_on_every_policy():
    cfg = _config("default")
    launch = router_launch(cfg["router"], ["http://127.0.0.1:30001"])
    assert launch.argv[1:4] == ["-m", "smg", "launch"]
    assert "--routing-key-override" in launch.argv and _value(launch.argv, "--assignment-mode") == "min_group"
    assert "--disable-tokenizer-autoload" in launch.argv  # never a hub download for HTTP workers
    assert reads_routing_key(cfg["router"]) and Gateway.from_config(cfg).routing_header == ROUTING_HEADER
    release = _config("default", ["router=sglang_router"])["router"]
    assert router_launch(release, ["http://127.0.0.1:30001"]).argv[1:3] == ["-m", "sglang_router.launch_router"]
    assert not reads_routing_key(release)  # 0.3.2 cache_aware routes on the text
    assert reads_routing_key({**release, "policy": "manual"})
    assert ROUTING_HEADER == "X-SMG-Routing-Key"  # what both routers' Rust cores read (smg: --routing-key-headers default)


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


@pytest.mark.parametrize("kind", ROUTER_KINDS)
def test_cache_aware_router_knobs_reach_the_command(kind):
    cfg = _config("default", [f"router={kind}", "router.args.cache_threshold=0.5"])
    launch = router_launch(cfg["router"], ["http://127.0.0.1:30001", "http://127.0.0.1:30002"])
    argv = launch.argv
    assert (_value(argv, "--cache-threshold"), _value(argv, "--balance-abs-threshold"),
            _value(argv, "--balance-rel-threshold")) == ("0.5", "64", "1.5")
    assert _value(argv, "--prometheus-port") == "29000" and launch.metrics_url == "http://127.0.0.1:29000"
    assert _value(argv, "--health-check-interval-secs") == "10" and _value(argv, "--cb-failure-threshold") == "5"


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


def test_flags_spell_values_like_the_servers_expect():
    assert flags({"enable_metrics": True, "disable_x": False, "tokenizer_path": None,
                  "kw": {"a": 1}, "urls": ["u1", "u2"], "n": 3}) == [
        "--enable-metrics", "--kw", '{"a":1}', "--urls", "u1", "u2", "--n", "3"]
    with pytest.raises(ValueError, match="router.args"):
        flags({"": 1}, "router.args")


def test_bad_worker_config_is_named():
    with pytest.raises(ValueError, match="workers: cannot import _target_ 'parser.serving.gateway.vllm_worker'"):
        worker_launches({"_target_": "parser.serving.gateway.vllm_worker"})
    with pytest.raises(ValueError, match="workers.model_path"):
        worker_launches({"num": 1})  # the default: SGLang workers
    with pytest.raises(ValueError, match="workers.ports"):
        worker_launches({"_target_": "parser.serving.gateway.module_worker", "module": "parser.serving.loopback", "num": 2, "ports": [1]})
    with pytest.raises(ValueError, match="workers.module"):
        worker_launches({"_target_": "parser.serving.gateway.module_worker", "num": 1})


def test_serve_script_dry_run_prints_commands_and_starts_nothing(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "parser", "gateway", "dry_run=true", "workers.num=2",
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
