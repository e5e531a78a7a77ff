"""The measurement behind docs/fidelity.md's top-p deviation, against its baseline in the same run.

Top-p: SmolLM2-135M-Instruct samples RAG-R1 multi-query prompts at T = 1 with top-p 1 (the default);
   at each sampled position, the nucleus top-p 0.95 would have kept (vLLM's rule: the smallest set of
   most likely tokens whose mass reaches 0.95). Printed: the mean −log(kept mass), which is how much
   every behaviour log-prob would exceed the trainer's full-vocabulary one under top-p 0.95, and the
   share of the tokens sampled at top-p 1 that top-p 0.95 could never have sampled.

    python bench/demo/fidelity.py [--prompts 16] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragr1.protocol.prompts import Mode
from ragr1.services.trainer import data
from ragr1.shipped import train_path


def top_p_gap(prompts: int, max_new_tokens: int) -> None:
    import torch

    from ragr1.model_paths import prepare_policy_model
    from ragr1.services.trainer.model import PolicyModel

    model = PolicyModel(prepare_policy_model(), bf16=False)
    tokenizer = model.tokenizer
    tasks = data.load_qa_tasks(train_path("hotpotqa"), "multi", limit=prompts)
    torch.manual_seed(0)
    nats, outside, tokens = [], 0, 0
    for task in tasks:
        ids = torch.tensor([data.render_prompt_ids(tokenizer, task.question, Mode.MULTI)])
        with torch.no_grad():
            out = model.lm.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0, top_k=0,
                top_p=1.0, max_new_tokens=max_new_tokens, pad_token_id=model.pad_id, output_scores=True,
                return_dict_in_generate=True,
            )
        for step, token in enumerate(out.sequences[0, ids.shape[1]:].tolist()):
            probs = torch.softmax(out.scores[step][0].float(), -1)
            ranked, order = probs.sort(descending=True)
            mass = ranked.cumsum(0)
            keep = int((mass < 0.95).sum()) + 1  # the token that reaches 0.95 is kept
            nats.append(-float(torch.log(mass[keep - 1])))
            outside += token not in set(order[:keep].tolist())
            tokens += 1
    print(f"\ntop-p 0.95 against top-p 1: {tokens} tokens sampled at T = 1 over {len(tasks)} RAG-R1 multi-query "
          f"prompts (HotpotQA), SmolLM2-135M-Instruct")
    print(f"   behaviour log-prob above the trainer's under top-p 0.95: mean {sum(nats) / len(nats):.4f}, "
          f"max {max(nats):.4f} nats per token")
    print(f"   tokens top-p 0.95 could not have sampled: {outside} ({outside / tokens:.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    top_p_gap(args.prompts, args.max_new_tokens)


if __name__ == "__main__":
    main()
