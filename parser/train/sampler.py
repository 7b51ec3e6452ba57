"""verl's async replay buffer, unchanged, plus ParSer's per-step metrics on what it samples.

Why it exists: verl 0.9.1's v1 trainer logs fixed fields per step (reward, lengths, turns,
staleness) but has no hook for an agent loop's own statistics. The replay buffer is the one
documented plugin point whose returned metrics go straight into the step's log
(`trainer.v1.sampler.custom_sampler`), and it is where a step's trajectories are chosen. So
this subclass calls verl's `ReplayBufferAsync.sample` — staleness control, dynamic-sampling
eviction and refill all stay verl's — then reads the sampled trajectories' `parser_stats`
from TransferQueue and adds `parser.train.metrics.step_metrics` to the returned metrics.

    trainer.v1.sampler.custom_sampler.path=pkg://parser.train.sampler
    trainer.v1.sampler.custom_sampler.name=ParserReplayBuffer
    trainer.v1.sampler.sampler_kwargs.dynamic_sampling=${algorithm.filter_groups.enable}
    trainer.v1.sampler.sampler_kwargs.filter_groups_metric=${algorithm.filter_groups.metric}

verl hands a custom sampler no `filter_groups_metric` (custom samplers "own their filtering"),
so dynamic sampling is passed through `sampler_kwargs` from `algorithm.filter_groups` — one
switch for both paths.

Dynamic sampling is bounded here (`sampler_kwargs.max_filtered_groups_per_step`). verl 0.9.1's
async buffer evicts every finished group whose rewards are all equal and asks for a new one,
with no limit: once the policy solves (or fails) every prompt it is given, no group is ever
sampleable and the trainer waits forever while the rollout keeps generating — what the CPU
smoke run did on its one-question set after 5 steps (13 minutes without a step, rollout busy).
Past the bound, uniform groups are trained on as they are (GRPO gives them zero advantage, so
they only add the KL term) and `parser/grpo/filter_budget_spent` says so.

Guards logged every step, so a run that silently stops learning shows it:
- `parser/staleness/dropped_fraction`: groups evicted as too stale / groups finished (sampled +
  evicted) — with `max_off_policy_strategy: drop` a slow trainer can throw most rollouts away;
  `parser/staleness/dropped_groups/sum` counts them.
- `parser/weights/{oldest,newest}_version/{min,max}`: the weight versions (trainer steps) the
  sampled trajectories were generated with; `parser/weights/unversioned/sum` the ones whose
  rollout reported none — a rollout that never receives new weights keeps reporting the old one.

With `parser.info_gain.enable` (InfoMem, `sampler_kwargs.info_gain: ${parser.info_gain}`) the
buffer also composes each finished GRPO group's reward before verl classifies or samples it
(`parser.train.infomem.group`: the gain of successful trajectories, normalised in the group, added to
the EM in `rm_scores`) and logs `parser/info_gain/*` per step.
"""
from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict
from verl.trainer.ppo.v1.replay_buffer import DAPO_FILTERED_REWARD_COUNTS_KEY, ReplayBufferAsync

from parser.train.infomem.gain import InfoGainConfig
from parser.train.infomem.group import compose_groups, final_outputs, info_gain_metrics
from parser.train.metrics import group_metrics, step_metrics

logger = logging.getLogger(__name__)


STALE_KEY = "training/off_policy/evicted_samples"  # verl's count of groups dropped as too stale
EVICTED_KEYS = (STALE_KEY, "training/filter_groups/evicted_samples", "training/rollout_failure/evicted_samples")


class ParserReplayBuffer(ReplayBufferAsync):
    def __init__(self, *args: Any, sampler_kwargs: Any = None, **kwargs: Any):
        sampler_kwargs = dict(sampler_kwargs or {})
        if sampler_kwargs.get("dynamic_sampling"):
            kwargs.setdefault("filter_groups_metric", str(sampler_kwargs.get("filter_groups_metric") or "reward"))
        bound = sampler_kwargs.get("max_filtered_groups_per_step")
        if bound is None or int(bound) < 0:
            raise ValueError("trainer.v1.sampler.sampler_kwargs.max_filtered_groups_per_step must be set (>= 0): "
                             "without a bound, dynamic sampling waits forever once every group's rewards are equal")
        self.max_filtered_groups = int(bound)
        self.filtered: Counter = Counter()  # global step -> uniform groups evicted and regenerated
        settings = sampler_kwargs.get("info_gain")
        self.info_gain = InfoGainConfig.from_settings(
            OmegaConf.to_container(settings, resolve=True) if isinstance(settings, DictConfig) else settings)
        self._composed: set[str] = set()  # uids whose rm_scores hold the composed reward
        super().__init__(*args, sampler_kwargs=sampler_kwargs, **kwargs)

    def _terminal_eviction_reasons(self, global_steps: int, partition_id: str):
        # verl calls this on every poll, right after syncing the metadata and before it evicts,
        # classifies (dynamic sampling) or selects groups: the one point that sees each finished
        # group before anything reads its reward (InfoMem composes it here)
        if partition_id == "train" and self.info_gain.enable:
            self._compose_finished_groups(partition_id)
        stale, uniform, failed, counts = super()._terminal_eviction_reasons(global_steps, partition_id)
        room = self.max_filtered_groups - self.filtered[global_steps]
        if len(uniform) > room:  # over budget: the rest are sampled as they are
            cache = self._dapo_classification_cache[partition_id]
            uniform = set(sorted(uniform)[:max(room, 0)])
            counts = Counter(cache[uid] for uid in uniform)
        return stale, uniform, failed, counts

    def _evict_terminal_groups(self, global_steps: int, partition_id: str, eviction_reasons):
        evicted = super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)
        self.filtered[global_steps] += evicted[2]
        return evicted

    def _compose_finished_groups(self, partition_id: str) -> None:
        """InfoMem's group step (parser.train.infomem.group): EM -> composed reward in `rm_scores`."""
        live = set(self.finished_keys[partition_id]) | set(self.running_keys[partition_id]) | set(self.pending_keys[partition_id])
        self._composed &= live  # groups already cleared from TransferQueue are forgotten
        todo = set(self.finished_keys[partition_id]) - self._composed
        keys = [key for key in self.partitions[partition_id] if key.split("_")[0] in todo]
        if keys:
            data = tq.kv_batch_get(keys=keys, partition_id=partition_id, select_fields=["extra_fields", "rm_scores"])
            scores = compose_groups(keys, _rows(data["extra_fields"]), self.info_gain)
            new = []
            for score, row in zip(scores, _unbind(data["rm_scores"]), strict=True):
                row = row.clone()
                if score is not None:  # the reward sits on the last response token, as verl put it
                    row.zero_()
                    row[-1] = score
                new.append(row)
            tq.kv_batch_put(keys=keys, partition_id=partition_id,
                            fields=TensorDict({"rm_scores": torch.nested.as_nested_tensor(new, layout=torch.jagged)},
                                              batch_size=len(keys)))
        self._composed |= todo

    def sample(self, global_steps: int, partition_id: str, batch_size: int):
        batch, metrics = super().sample(global_steps, partition_id, batch_size)
        if partition_id == "train" and batch.keys:
            fields = ["extra_fields", "response_mask"] + (["rm_scores"] if self.info_gain.enable else [])
            data = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=fields)
            metrics.update(metrics_from_extra_fields(data["extra_fields"]))
            metrics.update(mask_metrics(data["extra_fields"], data["response_mask"]))
            metrics.update(group_metrics(rewards_by_group(batch.keys, data["extra_fields"], batch.tags),
                                         metrics.get(DAPO_FILTERED_REWARD_COUNTS_KEY)))
            metrics.update(staleness_metrics(metrics, batch_size))
            metrics.update(version_metrics(batch.tags))
            metrics["parser/grpo/filter_budget_spent"] = float(self.filtered[global_steps] >= self.max_filtered_groups
                                                               and self.filter_groups_metric is not None)
            if self.info_gain.enable:
                scores = [float(r.sum()) for r in _unbind(data["rm_scores"])]
                metrics.update(info_gain_metrics(batch.keys, _rows(data["extra_fields"]), scores, batch.tags))
        return batch, metrics


def staleness_metrics(eviction_metrics: dict[str, Any], sampled_groups: int) -> dict[str, float]:
    """Groups dropped as too stale, and their share of the groups that finished for this sample."""
    stale = float(eviction_metrics.get(STALE_KEY, 0))
    finished = sampled_groups + sum(float(eviction_metrics.get(k, 0)) for k in EVICTED_KEYS)
    return {"parser/staleness/dropped_groups/sum": stale,
            "parser/staleness/dropped_fraction": stale / finished if finished else 0.0}


def version_metrics(tags: list[dict] | None) -> dict[str, float]:
    """The weight versions the sampled trajectories were generated with (verl's tags)."""
    rows = [t for t in tags or [] if not t.get("is_padding")]
    low = [t.get("min_global_steps") for t in rows]
    high = [t.get("max_global_steps") for t in rows]
    known = [(lo, hi) for lo, hi in zip(low, high, strict=True) if lo is not None and hi is not None]
    out = {"parser/weights/unversioned/sum": float(len(rows) - len(known))}
    if known:
        out.update({"parser/weights/oldest_version/min": float(min(lo for lo, _ in known)),
                    "parser/weights/newest_version/max": float(max(hi for _, hi in known))})
    return out


def _rows(extra_fields: Any) -> list[Any]:
    """Per-trajectory `extra_fields` as a list (verl hands a NonTensorStack / numpy array, tests lists)."""
    return extra_fields.tolist() if hasattr(extra_fields, "tolist") else list(extra_fields)


def _unbind(tensor: Any) -> list[Any]:
    """Per-trajectory rows of a TransferQueue field (kept unpadded: a jagged nested tensor)."""
    return tensor.unbind(0) if getattr(tensor, "is_nested", False) else list(tensor)


def mask_metrics(extra_fields: Any, response_mask: Any) -> dict[str, float]:
    """What the trainer will learn from, checked against what the engine generated.

    `parser/mask/mismatched_trajectories/sum`: trajectories (not cut at response_length) whose
    count of mask-1 tokens differs from the lead tokens the episode engine generated — must be
    0: the loss sees exactly the lead's tokens. `parser/mask/lead_token_fraction`: mask-1 tokens
    / response tokens (the rest are templates and observations, masked out).
    """
    rows = _rows(extra_fields)
    # TransferQueue keeps each trajectory's response unpadded (a jagged nested tensor)
    masks = _unbind(response_mask)
    mismatched = lead = total = 0
    for row, mask in zip(rows, masks, strict=True):
        stats = row.get("parser_stats") if isinstance(row, dict) else None
        if not stats:
            continue
        masked = int(mask.sum())
        lead += masked
        total += int(mask.numel())
        if not stats.get("truncated") and masked != int(stats["lead_tokens"]):
            mismatched += 1
    if not total:
        return {}
    return {"parser/mask/mismatched_trajectories/sum": float(mismatched), "parser/mask/lead_token_fraction": lead / total}


def rewards_by_group(keys: list[str], extra_fields: Any, tags: list[dict] | None = None) -> dict[str, list[float]]:
    """uid -> rewards of the sampled trajectories (verl keys them `{uid}_{session}_{i}`; a
    trajectory of several outputs counts once, by its last), padding skipped."""
    rows = _rows(extra_fields)
    groups: dict[str, list[float]] = {}
    for uid, sessions in final_outputs(keys).items():
        for i in sessions.values():
            if tags and tags[i].get("is_padding"):
                continue
            info = (rows[i] or {}).get("reward_extra_info") or {} if isinstance(rows[i], dict) else {}
            if "acc" in info:
                groups.setdefault(uid, []).append(float(info["acc"]))
    return groups


def metrics_from_extra_fields(extra_fields: Any) -> dict[str, float]:
    """Step metrics from the `extra_fields` of sampled trajectories (dicts, or a NonTensorStack)."""
    rows = _rows(extra_fields)
    rows = [r for r in rows if isinstance(r, dict)]
    stats = [r.get("parser_stats") for r in rows if r.get("parser_stats")]
    rewards = [r["reward_extra_info"]["acc"] for r in rows if "acc" in (r.get("reward_extra_info") or {})]
    if stats and len(stats) < len(rows):  # (a memory agent's rows carry none at all)
        logger.warning("%d of %d sampled trajectories carry no parser_stats (not from parser_agent?)",
                       len(rows) - len(stats), len(rows))
    return step_metrics(stats, rewards)
