"""The command lines ``stack/wiring.py`` writes are read back by each service's own config as the stack meant."""

from __future__ import annotations

from pathlib import Path

import yaml

from ragr1.cli import build_parser
from ragr1.services.common.config import from_args, home_of
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.config import RouterConfig, ShardConfig
from ragr1.services.reward.config import RewardConfig
from ragr1.services.trainer.config import PPOConfig, SFTConfig
from ragr1.stack import wiring
from ragr1.stack.config import StackConfig
from ragr1.stack.demo import Demo, demo_config


def test_every_service_reads_the_settings_the_stack_wrote(tmp_path: Path) -> None:
    config = StackConfig(base_port=40000, num_shards=3, reward="f1", max_turns=3, kv_cache_gib=1, trainer_threads=1,
                         temperature=0.7)
    p = wiring.Ports.of(config)
    parser = build_parser()
    *shards, router = wiring.retrieval_specs(config, p, tmp_path / "index")
    specs = {
        "reward": (wiring.reward_spec(config, p), RewardConfig),
        "policy": (wiring.policy_spec(config, p, tmp_path / "model", name="policy-1", port=40100), PolicyConfig),
        "trainer": (wiring.trainer_spec(config, p, tmp_path / "model", tmp_path / "out"), PPOConfig),
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
    assert (policy.max_turns, policy.kv_cache_gib, policy.worker_name, policy.model, policy.temperature) == (
        3, 1, "policy-1", str(tmp_path / "model"), 0.7)
    assert (policy.retriever_address, policy.reward_address, policy.redis_url) == (
        router.target, specs["reward"][0].target, p.redis_url())
    trainer = read["trainer"]
    assert (trainer.threads, trainer.output_dir, trainer.redis_url) == (1, str(tmp_path / "out"), p.redis_url())


def test_the_demo_s_sft_and_rl_commands_carry_its_settings(tmp_path: Path) -> None:
    """The demo writes ``train sft`` and ``train ppo`` command lines from its own settings; read back by the
    trainer's configs, they say what the demo's flags said."""
    demo = Demo(demo_config(**{"run_dir": str(tmp_path / "run"), "base_port": 41000, "sft.epochs": 2,
                               "sft.lr": 3e-5, "tokens_per_query": 96, "ppo.batch_size": 12,
                               "ppo.samples_per_prompt": 4, "ppo.actor_lr": 2e-4, "ppo.mode": "single"}))
    demo.model, demo.train_file, demo.rl_file = tmp_path / "model", tmp_path / "train.jsonl", tmp_path / "rl.jsonl"
    parser = build_parser()
    sft = from_args(SFTConfig, parser.parse_args(demo.sft_args(tmp_path / "sft")))
    assert (sft.model, sft.train_files, sft.modes, sft.epochs, sft.lr, sft.tokens_per_query, sft.output_dir) == (
        str(tmp_path / "model"), [str(tmp_path / "train.jsonl")], ["single", "multi"], 2, 3e-5, 96,
        str(tmp_path / "sft"))
    ppo = from_args(PPOConfig, parser.parse_args(demo.rl_spec(tmp_path / "sft-model", 1).args))
    assert (ppo.model, ppo.prompts_file, ppo.mode, ppo.start_version, ppo.batch_size, ppo.samples_per_prompt,
            ppo.actor_lr, ppo.port) == (
        str(tmp_path / "sft-model"), str(tmp_path / "rl.jsonl"), "single", 1, 12, 4, 2e-4, 41005)


def test_the_demo_trains_with_the_trainer_s_default_learning_rates(tmp_path: Path) -> None:
    """Unless told otherwise, the demo's RL stage gets the rates a user of ``ragr1 train ppo`` gets: no
    learning rate or LoRA rank on its command line. A preset that sets them (search-r1, rag-r1: their
    published values, said in the file) gets exactly its own."""
    presets = sorted((Path(wiring.__file__).parent / "presets").glob("*.yaml"))
    assert len(presets) >= 3
    own_rates = 0
    for preset in presets:
        demo = Demo(demo_config(preset.stem, run_dir=str(tmp_path / "run")))
        demo.model, demo.rl_file = tmp_path / "model", tmp_path / "rl.jsonl"
        args = demo.rl_spec(tmp_path / "sft-model", 1).args
        ppo = from_args(PPOConfig, build_parser().parse_args(args))
        said = {k: v for k, v in (yaml.safe_load(preset.read_text()).get("ppo") or {}).items()
                if k in ("actor_lr", "critic_lr", "lora_rank")}
        if not said:
            assert not {"--actor-lr", "--critic-lr", "--lora-rank"} & set(args), preset.name
            assert (ppo.actor_learning_rate, ppo.critic_learning_rate) == (
                PPOConfig().actor_learning_rate, PPOConfig().critic_learning_rate), preset.name
            continue
        own_rates += 1
        chosen = {"actor_lr": ppo.actor_learning_rate, "critic_lr": ppo.critic_learning_rate,
                  "lora_rank": ppo.lora_rank}
        assert {k: chosen[k] for k in said} == said, preset.name
    assert own_rates < len(presets)


def test_what_the_stack_passes_on_under_a_setting_s_name_is_that_setting(tmp_path: Path) -> None:
    """``ragr1 up --max-turns`` is the policy's ``max_turns``, its default and help included: one home."""
    config = StackConfig()
    p = wiring.Ports.of(config)
    passed = {
        PolicyConfig: wiring.policy_spec(config, p, tmp_path / "model").args,
        PPOConfig: wiring.trainer_spec(config, p, tmp_path / "model", tmp_path / "out").args,
        RewardConfig: wiring.reward_spec(config, p).args,
    }
    shared = set()
    for cls, args in passed.items():
        for arg, value in zip(args, [*args[1:], ""], strict=True):
            name = arg.removeprefix("--").replace("-", "_")
            if arg.startswith("--") and str(getattr(config, name, None)) == value and hasattr(cls(), name):
                assert home_of(StackConfig, name) is home_of(cls, name), (cls.__name__, name)
                shared.add(name)
    assert {"max_turns", "tokens_per_query", "kv_cache_gib"} <= shared
