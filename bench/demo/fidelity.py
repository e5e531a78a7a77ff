"""The measurements behind docs/fidelity.md's deviations, each against its baseline in the same run.

1. SFT searches against RL's parser, over every shipped training question: how many multi-query searches
   the parser reads as other queries than their information block shows, and how many split into more
   than ``MAX_QUERIES`` parts; for the gold titles joined with ", " (the builder before the fix: the
   baseline) and for the builder's searches now.
2. Top-p: SmolLM2-135M-Instruct samples RAG-R1 multi-query prompts at T = 1 with top-p 1 (the default);
   at each sampled position, the nucleus top-p 0.95 would have kept (vLLM's rule: the smallest set of
   most likely tokens whose mass reaches 0.95). Printed: the mean −log(kept mass), which is how much
   every behaviour log-prob would exceed the trainer's full-vocabulary one under top-p 0.95, and the
   share of the tokens sampled at top-p 1 that top-p 0.95 could never have sampled.

    python bench/demo/fidelity.py [--prompts 16] [--max-new-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from ragr1.protocol.grammar import INFORMATION_CLOSE, INFORMATION_OPEN, parse_action
from ragr1.protocol.information import InformationFormat
from ragr1.protocol.prompts import MAX_QUERIES, QUERY_SEPARATOR, Mode, Tokenizer
from ragr1.protocol.trajectories import SupportedQuestion, search_call, trajectory
from ragr1.services.trainer import data
from ragr1.shipped import TRAIN_SETS, train_path


def _read(search: str) -> list[str]:
    return list(parse_action(search, multi_query=True, separator=QUERY_SEPARATOR, max_queries=MAX_QUERIES).queries)


def _parts(search: str) -> int:
    content = search.split("<search>", 1)[1].split("</search>", 1)[0]
    return sum(1 for q in content.split(QUERY_SEPARATOR) if q.strip())


def sft_searches(tokenizer: Tokenizer) -> None:
    information = InformationFormat(tokenizer, 0)  # the layout is measured, not the budget
    print("1. multi-query SFT searches against RL's parser (every shipped training question)")
    print(f"{'set':<9} {'questions':>9} {'comma title':>11} {'>3 gold':>7} {'searches':>8}   "
          f"{'misread, joined titles':>22} {'>3 parts':>8}   {'misread now':>11} {'>3 parts':>8}")
    totals = [0] * 6
    for name in TRAIN_SETS:
        items: list[SupportedQuestion] = data.load_supported_questions(train_path(name))
        searches = old_misread = old_over = new_misread = new_over = 0
        for item in items:
            calls = [item.gold[i : i + MAX_QUERIES] for i in range(0, len(item.gold), MAX_QUERIES)]
            for call in calls:  # the baseline: the titles as they are, joined with ", "
                titles = [title for title, _ in call]
                searches += 1
                old_misread += _read(search_call(titles)) != titles
                old_over += _parts(search_call(titles)) > MAX_QUERIES
            pieces = trajectory(item, Mode.MULTI, information, top_k=1)
            for (searched, _), (block, _) in zip(pieces[0:-1:2], pieces[1::2], strict=True):
                shown = json.loads(block[len(INFORMATION_OPEN) : -len(INFORMATION_CLOSE)])["query"]
                new_misread += _read(searched) != shown
                new_over += _parts(searched) > MAX_QUERIES
        comma = sum(1 for item in items if any(QUERY_SEPARATOR in title for title, _ in item.gold))
        over_gold = sum(1 for item in items if len(item.gold) > MAX_QUERIES)
        print(f"{name:<9} {len(items):>9} {comma:>11} {over_gold:>7} {searches:>8}   {old_misread:>22} "
              f"{old_over:>8}   {new_misread:>11} {new_over:>8}")
        for i, value in enumerate((searches, old_misread, old_over, new_misread, new_over, len(items))):
            totals[i] += value
    searches, old_misread, old_over, new_misread, new_over, questions = totals
    print(f"{'all':<9} {questions:>9} {'':>11} {'':>7} {searches:>8}   {old_misread:>22} {old_over:>8}   "
          f"{new_misread:>11} {new_over:>8}")


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
    print(f"\n2. top-p 0.95 against top-p 1: {tokens} tokens sampled at T = 1 over {len(tasks)} RAG-R1 multi-query "
          f"prompts (HotpotQA), SmolLM2-135M-Instruct")
    print(f"   behaviour log-prob above the trainer's under top-p 0.95: mean {sum(nats) / len(nats):.4f}, "
          f"max {max(nats):.4f} nats per token")
    print(f"   tokens top-p 0.95 could not have sampled: {outside} ({outside / tokens:.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from ragr1.model_paths import prepare_policy_model

    sft_searches(AutoTokenizer.from_pretrained(str(prepare_policy_model())))
    top_p_gap(args.prompts, args.max_new_tokens)


if __name__ == "__main__":
    main()
