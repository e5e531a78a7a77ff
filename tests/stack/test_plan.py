"""The command lines ``stack/plan.py`` writes are read back by each service's own config as the stack meant."""

from __future__ import annotations

from pathlib import Path

from ragr1.cli import build_parser
from ragr1.services.common.config import from_args
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.reward.config import RewardConfig
from ragr1.services.trainer.config import PPOConfig
from ragr1.stack import plan
from ragr1.stack.config import StackConfig


def test_every_service_reads_the_settings_the_stack_wrote(tmp_path: Path) -> None:
    config = StackConfig(base_port=40000, shards=3, reward="f1", max_turns=3, kv_cache_gib=1, trainer_threads=1)
    p = plan.Ports.of(config)
    parser = build_parser()
    *shards, router = plan.retrieval_specs(config, p, tmp_path / "index")
    specs = {
        "reward": (plan.reward_spec(config, p), RewardConfig),
        "policy": (plan.policy_spec(config, p, tmp_path / "model", name="policy-1", port=40100), PolicyConfig),
        "trainer": (plan.trainer_spec(config, p, tmp_path / "model", tmp_path / "out", replicas=(40100,)), PPOConfig),
        "router": (router, RouterConfig),
        **{f"shard {i}": (spec, ShardConfig) for i, spec in enumerate(shards)},
    }
    read = {}
    for name, (spec, cls) in specs.items():
        read[name] = from_args(cls, parser.parse_args(spec.args))
        assert (read[name].host, read[name].port, read[name].metrics_port) == (
            spec.host, spec.port, spec.metrics_port), name
    assert [read[f"shard {i}"].shard for i in range(3)] == [0, 1, 2]
    assert read["router"].shards == [s.target for s in shards]
    assert read["router"].index == str(tmp_path / "index")
    assert (read["reward"].em_weight, read["reward"].f1_weight) == (0.0, 1.0)
    policy = read["policy"]
    assert (policy.max_turns, policy.kv_cache_gib, policy.worker_name, policy.model) == (
        3, 1, "policy-1", str(tmp_path / "model"))
    assert (policy.retriever_address, policy.reward_address, policy.redis_url) == (
        router.target, specs["reward"][0].target, p.redis_url())
    trainer = read["trainer"]
    assert (trainer.policy_replicas, trainer.threads, trainer.output_dir) == (
        [f"{plan.HOST}:40100"], 1, str(tmp_path / "out"))
