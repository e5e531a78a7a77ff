"""Settings of the local stack and the demo (what to start, on which ports, how big), and of
``ragr1 eval`` and ``ragr1 data prepare``."""

from __future__ import annotations

import dataclasses

from ragr1.services.common import ports
from ragr1.services.common.config import InformationSettings, Validated, check_at_least, check_choice, same_as, setting
from ragr1.services.policy.config import PolicyConfig
from ragr1.services.retriever.config import BuildConfig
from ragr1.services.trainer.config import SFTConfig
from ragr1.shipped import EVAL_BENCHMARKS, TRAIN_SETS
from ragr1.stack.evaluate import parse_modes
from ragr1.stack.supervisor import RestartPolicy

# The reward service's settings for each ``--reward`` of the stack; em is the service's own default (RAG-R1's).
# parallel-search takes its scheme's own constants (the reward's ``parallel_search`` section).
REWARD_WEIGHTS: dict[str, dict[str, float | str]] = {
    "em": {}, "f1": {"em_weight": 0.0, "f1_weight": 1.0}, "parallel-search": {"scheme": "parallel_search"},
}


@dataclasses.dataclass
class StackConfig(Validated):
    run_dir: str = setting("", "where logs, endpoints.json, checkpoints and reports go; empty: runs/<time>")
    base_port: int = setting(0, "0: the default ports of ports.py; else every port counted from this one")
    # Two, so that every search fans out; an index build's own default is one shard file.
    num_shards: int = setting(2, "retriever shard processes (and shard files of the stack's index)")
    index_type: str = same_as(BuildConfig, "index_type")
    # Shorter than the encoder's preset (what `ragr1 index build` keeps): the stack indexes in minutes.
    max_passage_tokens: int = setting(128, "encoder tokens kept per passage when the stack builds its index")
    # The policy's settings, under its names (the stack passes them on).
    model: str = same_as(PolicyConfig, "model")
    max_turns: int = same_as(PolicyConfig, "max_turns")
    max_tokens_per_turn: int = same_as(PolicyConfig, "max_tokens_per_turn")
    tokens_per_query: int = same_as(PolicyConfig, "tokens_per_query")
    max_model_len: int = same_as(PolicyConfig, "max_model_len")
    # The rollout workers' (RL's) sampling; evaluations ask for greedy decoding per request.
    temperature: float = same_as(PolicyConfig, "temperature")
    reward: str = setting("em", "what the reward service pays for: em (exact match, RAG-R1's), f1 "
                          "(token F1: partial credit, a denser signal for small models) or parallel-search "
                          "(ParallelSearch's: exact match with format, decomposing comparison questions' first "
                          "search, the fewest searches each question type needs)")
    kv_cache_gib: int = same_as(PolicyConfig, "kv_cache_gib")
    # The engine's batch and how many trajectories each replica's worker keeps going (0: that batch, as many as
    # the KV cache above holds): said here so that `ragr1 up` states what every replica runs.
    max_num_seqs: int = same_as(PolicyConfig, "max_num_seqs")
    max_in_flight: int = same_as(PolicyConfig, "max_in_flight")
    trainer_threads: int = setting(
        0, "PPO trainer: torch threads; 0: half the cores (the policy's vLLM engine computes on the others)"
    )
    start_timeout: float = setting(600.0, "seconds a service may take to become healthy")

    def validate(self) -> None:
        super().validate()
        check_choice("reward", self.reward, tuple(REWARD_WEIGHTS))
        check_at_least(self, (("base_port", 0), ("num_shards", 1), ("trainer_threads", 0), ("max_turns", 0)))


@dataclasses.dataclass
class UpConfig(StackConfig):
    index_passages: int = setting(0, "index the first N corpus passages; 0: the whole shipped corpus")
    trainer: bool = setting(True, "start the PPO trainer too (it trains until stopped)")
    policy_replicas: int = setting(
        1, "policy replicas (rollout workers, each with its own vLLM engine); `ragr1 scale` changes the number "
        "while the stack runs"
    )
    auth: bool = setting(
        False, "a random bearer token on every gRPC call and a Redis password, in files under run_dir/secrets"
    )
    max_restarts: int = same_as(RestartPolicy, "max_restarts")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("max_restarts", 0), ("index_passages", 0), ("policy_replicas", 1)))


@dataclasses.dataclass
class ScaleConfig(Validated):
    """``ragr1 scale``: how many policy replicas the running local stack in ``run_dir`` should have."""

    run_dir: str = setting("", "the run folder of the running `ragr1 up` (it holds endpoints.json)")
    policy_replicas: int = setting(0, "policy replicas wanted (at least 1)")
    timeout: float = setting(900.0, "seconds to wait for the stack to reach that number, every replica serving")

    def validate(self) -> None:
        super().validate()
        if not self.run_dir:
            raise ValueError("run_dir: give the run folder of the running `ragr1 up` (--run-dir)")
        if self.policy_replicas < 1:
            raise ValueError(f"policy_replicas: give the number of replicas wanted, at least 1 "
                             f"(got {self.policy_replicas})")
        if self.timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")


@dataclasses.dataclass
class EvalSettings(Validated):
    """How ``ragr1 eval`` calls the policy (the demo's evaluations too)."""

    batch_size: int = setting(16, "questions per Policy.Rollout call")

    def validate(self) -> None:
        super().validate()
        check_at_least(self, (("batch_size", 1),))


@dataclasses.dataclass
class EvalConfig(EvalSettings):
    """``ragr1 eval``."""

    policy: str = setting(f"127.0.0.1:{ports.POLICY}", "policy gRPC address")
    endpoints: str = setting("", "endpoints.json of `ragr1 up` (overrides --policy)")
    benchmarks: list[str] = setting(list, f"comma-separated, of: {', '.join(EVAL_BENCHMARKS)}", factory=True)
    file: list[str] = setting(
        list, "JSONL files in the same layout (question, golden_answers) or Search-R1 / RAG-R1 parquet files "
        "(test.parquet), comma-separated", factory=True
    )
    limit: int | None = setting(None, "first N questions of each")
    mode: str = setting(
        "multi", "none (no retrieval), single, multi, search-r1 (Search-R1's prompt, layout and scoring), a "
        "comma-separated list, both (single,multi) or all (none,single,multi)"
    )
    checkpoint: str = setting("", "load this checkpoint into the policy first")
    out: str = setting("", "write the summaries and every question's answer and scores as JSON here")

    def validate(self) -> None:
        super().validate()
        if not self.benchmarks and not self.file:
            raise ValueError("benchmarks and file are both empty: nothing to evaluate")
        unknown = [b for b in self.benchmarks if b not in EVAL_BENCHMARKS]
        if unknown:
            raise ValueError(f"benchmarks: unknown {unknown}; known: {', '.join(EVAL_BENCHMARKS)}")
        self.modes()
        check_at_least(self, (("limit", 1),))

    def modes(self) -> list[str]:
        return parse_modes(self.mode)


@dataclasses.dataclass
class PrepareConfig(InformationSettings):
    """``ragr1 data prepare``: the information blocks as ``train sft`` and the policy cut them."""

    train_files: list[str] = setting(
        lambda: list(TRAIN_SETS),
        "shipped sets and/or JSONL files with question, golden_answers, paragraphs (comma-separated)",
        factory=True,
    )
    out: str = setting("runs/data", "output folder")
    limit: int | None = setting(None, "first N questions of each file")
    # The policy's: its tokenizer cuts the information blocks.
    model: str = same_as(PolicyConfig, "model")
    retriever_address: str = same_as(SFTConfig, "retriever_address")
    max_turns: int = same_as(SFTConfig, "max_turns")

    def validate(self) -> None:
        super().validate()
        if not self.train_files:
            raise ValueError("train_files is empty: name a shipped set or a JSONL file")
        check_at_least(self, (("limit", 1),))
