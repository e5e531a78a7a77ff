"""Every service's config checks itself when it is made, from flags, the environment, a file or
``dataclasses.replace``: a bad value is refused naming the setting before anything is built (no model
loaded, no port bound)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from ragr1.services.common.config import load
from ragr1.services.common.server import ServerConfig
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.reward.config import RewardConfig
from ragr1.services.trainer.config import PPOConfig, SFTConfig

ROUTER = {"index": "idx", "shards": "127.0.0.1:1"}

CASES: list[tuple[type, dict[str, Any], str]] = [
    (ServerConfig, {"tls_cert_file": "cert.pem"}, "tls_key_file"),
    (ServerConfig, {"tls_client_ca_file": "ca.pem"}, "tls_client_ca_file"),
    (RewardConfig, {"relevance_weight": "2"}, "relevance_weight"),
    (RewardConfig, {"scheme": "bogus"}, "scheme"),
    (RewardConfig, {"max_items": "0"}, "max_items"),
    (PolicyConfig, {"max_batch": "0"}, "max_batch"),
    (PolicyConfig, {"worker": "true"}, "reward_address"),
    (PolicyConfig, {"on_weight_update": "later"}, "on_weight_update"),
    (PolicyConfig, {"heartbeat_seconds": "0"}, "heartbeat_seconds"),
    (PolicyConfig, {"checkpoint_wait_seconds": "-1"}, "checkpoint_wait_seconds"),
    (ShardConfig, {}, "index"),
    (ShardConfig, {"index": "idx", "checksum": "sometimes"}, "checksum"),
    (RouterConfig, {"index": "idx"}, "shards"),
    (RouterConfig, {**ROUTER, "on_shard_failure": "ignore"}, "on_shard_failure"),
    (PPOConfig, {"batch_size": "6", "mini_batch_size": "2", "samples_per_prompt": "4"}, "samples_per_prompt"),
    (PPOConfig, {"advantage": "vtrace"}, "advantage"),
    (PPOConfig, {"mode": "both"}, "mode"),
    (PPOConfig, {"fleet_poll_seconds": "0"}, "fleet_poll_seconds"),
    (PPOConfig, {"weights_timeout_seconds": "-1"}, "weights_timeout_seconds"),
    (SFTConfig, {"micro_batch_size": "0"}, "micro_batch_size"),
    (SFTConfig, {"device": "tpu"}, "device"),
    (SFTConfig, {"lora_rank": "-1"}, "lora_rank"),
    (PPOConfig, {"lora_rank": "-1"}, "lora_rank"),
    (PolicyConfig, {"gpu_memory_utilization": "1.5"}, "gpu_memory_utilization"),
    (PolicyConfig, {"mode": "both"}, "search mode"),
]


@pytest.mark.parametrize(("cls", "values", "named"), CASES, ids=[f"{c.__name__}-{n}" for c, _, n in CASES])
def test_a_bad_value_is_refused_when_the_config_is_made_naming_the_setting(
    cls: type, values: dict[str, Any], named: str, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=named):
        load(cls, overrides=values, env={})  # flags
    env = {f"RAGR1_{k.upper()}": v for k, v in values.items()}
    with pytest.raises(ValueError, match=named):
        load(cls, env=env)  # the environment
    file = tmp_path / "settings.json"
    file.write_text("{" + ", ".join(f'"{k}": "{v}"' for k, v in values.items()) + "}")
    with pytest.raises(ValueError, match=named):
        load(cls, file=file, env={})  # a config file


def test_replace_checks_too_so_a_derived_config_cannot_skip_the_checks() -> None:
    config = load(RouterConfig, overrides=ROUTER, env={})
    assert config.shards == ["127.0.0.1:1"]
    with pytest.raises(ValueError, match="on_shard_failure"):
        dataclasses.replace(config, on_shard_failure="ignore")
    # What `ragr1 serve rollout-worker` does to a policy config without a reward service.
    with pytest.raises(ValueError, match="reward_address"):
        dataclasses.replace(PolicyConfig(), worker=True)
