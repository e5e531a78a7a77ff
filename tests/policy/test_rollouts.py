"""A trajectory as the ``Rollout`` it travels in: what it copies from its task, so that the trainer and the
evaluation need nothing else."""

from __future__ import annotations

from collections.abc import Sequence

from ragr1.services.policy.agent import Sampling, Trajectory, TrajectoryStatus
from ragr1.services.policy.rollouts import task_of, to_rollout
from ragr1.v1 import common_pb2


class Ids:
    """Stands in for a tokenizer: the ids written out."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return " ".join(map(str, ids))


def test_a_rollout_carries_its_task_s_source_and_question_type() -> None:
    for source, kind in (("hotpotqa", "comparison"), ("popqa", "single-hop"), ("mine", "")):
        task = common_pb2.PromptTask(id=f"{source}-1", question="Who is older, A or B?", golden_answers=["A"],
                                     data_source=source, question_type=kind, mode=common_pb2.SEARCH_MODE_MULTI)
        t = Trajectory(task_of(task), prompt_ids=[1, 2], policy_version=3, response_ids=[4, 5], loss_mask=[1, 1],
                       logprobs=[-0.5, -0.25], status=TrajectoryStatus.ANSWERED)
        rollout = to_rollout(t, task, Ids(), Sampling(), sample=1)  # type: ignore[arg-type]
        assert (rollout.data_source, rollout.question_type) == (source, kind)
        assert (rollout.task_id, rollout.question, list(rollout.golden_answers)) == (
            task.id, task.question, list(task.golden_answers))
