"""The reward service end to end: real gRPC clients against ``ragr1 serve reward`` on a loopback port."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, event, given, settings

from ragr1.errors import ServiceCallError
from ragr1.protocol.prompts import INVALID_ACTION_FEEDBACK
from ragr1.services.common.process import ServiceProcess
from ragr1.services.common.redis_server import free_port
from ragr1.services.reward.client import AsyncRewardClient, RewardClient
from ragr1.shipped import eval_path, read_jsonl
from ragr1.v1 import common_pb2, reward_pb2
from tests.common import fuzz
from tests.deploy.dashboards import METRIC, expressions

LIMITS = ("--max-items", "8", "--max-response-chars", "5000", "--max-rounds", "4")


@dataclasses.dataclass
class Server:
    target: str
    metrics_url: str


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``ragr1 serve reward`` in a child process, with Search-R1's v0.3 scheme and small limits."""
    port, metrics_port = free_port(), free_port()
    log = Path(tmp_path_factory.mktemp("reward")) / "server.log"
    args = ["serve", "reward", "--port", str(port), "--metrics-port", str(metrics_port),
            "--scheme", "search_r1_v03", *LIMITS]
    with ServiceProcess.ragr1("reward", args, f"127.0.0.1:{port}", log, start_timeout=60):
        yield Server(f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics")


@pytest.fixture()
def client(server: Server) -> Iterator[RewardClient]:
    with RewardClient(server.target) as c:
        yield c


def _item(answer: str, golds: list[str], **kwargs: object) -> reward_pb2.ScoreItem:
    response = (
        f"<think>Let me search.</think><search>{golds[0] if golds else 'x'}</search>"
        "<information>Doc 1(Title: T) something</information>"
        f"<think>Found it.</think><answer>{answer}</answer>"
    )
    return reward_pb2.ScoreItem(response=response, golden_answers=golds, **kwargs)  # type: ignore[arg-type]


def test_health(client: RewardClient) -> None:
    assert client.health()


def test_batch_of_real_questions(client: RewardClient) -> None:
    questions = list(read_jsonl(eval_path("popqa"), limit=6))
    items = []
    for i, q in enumerate(questions):
        answer = q["golden_answers"][-1].upper() if i % 2 == 0 else "I do not know"
        items.append(_item(answer, q["golden_answers"], id=q["id"]))
    scores = client.score(items)
    assert [s.exact_match for s in scores] == [1.0, 0.0] * 3
    # search_r1_v03: right answer in a valid format 1, wrong answer in a valid format 0.2
    assert [s.total for s in scores] == pytest.approx([1.0, 0.2] * 3)
    assert all(s.format == 1.0 for s in scores)
    assert scores[1].extracted_answer == "I do not know"
    assert "wrong_answer" in scores[1].reasons


def test_structured_passages_give_the_process_reward(client: RewardClient) -> None:
    passages = [common_pb2.Passage(title="Paris", text="Paris is the capital of France.")]
    item = _item("Paris", ["Paris"], retrieved=passages, retrieved_rounds=[0])
    assert client.score([item])[0].process == 1.0


def test_spans_are_scored_on_what_the_model_generated(client: RewardClient) -> None:
    """What the rollout workers send: the feedback span quotes "<answer> and </answer>" and is ignored."""
    spans = [
        common_pb2.ResponseSpan(text="I am not sure.", kind=common_pb2.SPAN_KIND_GENERATED),
        common_pb2.ResponseSpan(text=INVALID_ACTION_FEEDBACK, kind=common_pb2.SPAN_KIND_FEEDBACK),
    ]
    (never,) = client.score([reward_pb2.ScoreItem(spans=spans, golden_answers=["and"])])
    assert never.extracted_answer == "" and never.total == 0.0
    answered = [*spans, common_pb2.ResponseSpan(text="<think>ok</think><answer> and </answer>",
                                                kind=common_pb2.SPAN_KIND_GENERATED)]
    (scored,) = client.score([reward_pb2.ScoreItem(spans=answered, golden_answers=["and"])])
    assert scored.exact_match == 1.0 and "invalid_action" in scored.reasons


def test_a_span_without_a_kind_is_refused(client: RewardClient) -> None:
    item = reward_pb2.ScoreItem(spans=[common_pb2.ResponseSpan(text="<answer> x </answer>")], golden_answers=["x"])
    with pytest.raises(ServiceCallError) as err:
        client.score([item])
    assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "items[0].spans[0].kind is 0: say who wrote the span" in err.value.message


def test_bad_items_get_reasons_not_errors(client: RewardClient) -> None:
    scores = client.score([
        reward_pb2.ScoreItem(response="", golden_answers=["x"]),
        _item("Paris", []),
        reward_pb2.ScoreItem(response="<answer>x</answer>" * 1000, golden_answers=["x"]),
        reward_pb2.ScoreItem(
            response="<think>broken \ufffd bytes</think><answer>x</answer>", golden_answers=["x"]
        ),
    ])
    assert [s.total for s in scores] == [0.0, 0.0, 0.0, 1.0]
    assert "empty_response" in scores[0].reasons
    assert "missing_gold" in scores[1].reasons
    assert "response_too_long" in scores[2].reasons
    assert "replacement_char" in scores[3].reasons


def test_empty_batch(client: RewardClient) -> None:
    assert client.score([]) == []


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([_item("a", ["a"])] * 9, "9 items in one request, the limit is 8"),
        ([_item("a", ["a"], retrieved=[common_pb2.Passage(title="t")] * 2, retrieved_rounds=[0])],
         "items[0].retrieved_rounds has 1 entries but retrieved has 2"),
        ([_item("a", ["a"]), _item("a", ["a"], retrieved=[common_pb2.Passage()], retrieved_rounds=[7])],
         "items[1].retrieved_rounds: round 7 is outside [0, 4)"),
    ],
)
def test_malformed_requests_are_invalid_argument(
    client: RewardClient, items: list[reward_pb2.ScoreItem], message: str
) -> None:
    with pytest.raises(ServiceCallError) as caught:
        client.score(items)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.message


def test_invalid_utf8_is_invalid_argument(server: Server) -> None:
    """Bytes that are not UTF-8 in a string field: the request cannot be parsed, and the caller is told."""
    item = b"\x12\x04\xff\xfe<a"  # ScoreItem.response (field 2) = ff fe 3c 61
    request = b"\x0a" + bytes([len(item)]) + item  # ScoreRequest.items (field 1)
    with grpc.insecure_channel(server.target) as channel:
        score = channel.unary_unary("/ragr1.v1.Reward/Score")
        with pytest.raises(grpc.RpcError) as caught:
            score(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "String field had bad UTF-8" in caught.value.details()


def test_async_client(server: Server) -> None:
    async def run() -> tuple[bool, list[common_pb2.RewardParts]]:
        async with AsyncRewardClient(server.target) as client:
            return await client.health(), await client.score([_item("the Louvre", ["Louvre"])], timeout=10)

    healthy, scores = asyncio.run(run())
    assert healthy
    assert scores[0].exact_match == 1.0


def test_metrics(client: RewardClient, server: Server) -> None:
    client.score([_item("Paris", ["Paris"]), _item("Lyon", ["Paris"])])
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    assert "ragr1_reward_batch_items_count" in text
    assert 'ragr1_reward_reasons_total{reason="wrong_answer"}' in text
    assert 'ragr1_reward_part_score_count{part="exact_match"}' in text
    assert 'ragr1_reward_last_batch_mean_score{part="exact_match"} 0.5' in text
    assert 'ragr1_grpc_server_requests_total{code="INVALID_ARGUMENT",method="Score",service="reward"}' in text
    # Every series of the reward service a dashboard charts is exported once it has scored (a histogram whose
    # buckets go below 0 exports no _sum: charted, it showed nothing).
    charted = {m for _, _, expr in expressions() for m in METRIC.findall(expr) if m.startswith("ragr1_reward_")}
    assert charted and not {m for m in charted if f"\n{m}{{" not in text and f"\n{m} " not in text}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=fuzz.requests(reward_pb2.ScoreRequest.DESCRIPTOR))
def test_hostile_score_requests_get_defined_answers(server: Server, body: bytes) -> None:
    """Garbage, extreme and corrupted ScoreRequests: answered in time, OK or INVALID_ARGUMENT."""
    with grpc.insecure_channel(server.target) as channel:
        code = fuzz.call(channel, "/ragr1.v1.Reward/Score", body, timeout=10)
    event(code.name)
    assert code in fuzz.DEFINED, code


def test_the_service_is_healthy_after_the_fuzzing(client: RewardClient) -> None:
    assert client.health()
    assert client.score([_item("Paris", ["Paris"])])[0].exact_match == 1.0


def test_a_message_over_the_size_cap_is_refused_and_the_service_goes_on(tmp_path: Path) -> None:
    port = free_port()
    args = ["serve", "reward", "--port", str(port), "--metrics-port", "0", "--max-message-bytes", "65536"]
    target = f"127.0.0.1:{port}"
    log = tmp_path / "server.log"
    with ServiceProcess.ragr1("reward", args, target, log, start_timeout=60), RewardClient(target) as c:
        with pytest.raises(ServiceCallError) as caught:
            c.score([_item("x" * 100_000, ["x"])])
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert c.health()
        assert c.score([_item("Paris", ["Paris"])])[0].exact_match == 1.0
