"""The <information> block: RAG-R1's layouts, and each query's documents cut to their own budget."""

from __future__ import annotations

import json
import random
from typing import Any

from ragr1.protocol.grammar import INFORMATION_CLOSE, INFORMATION_OPEN
from ragr1.protocol.information import InformationFormat, Passage, documents
from ragr1.services.policy.agent import BLOCK_OVERHEAD_TOKENS, QUERY_OVERHEAD_TOKENS
from ragr1.shipped import corpus_path, read_jsonl

HAMLET = Passage("1", "Hamlet", "A tragedy by William Shakespeare.")
STRATFORD = Passage("2", "Stratford-upon-Avon", "A market town in Warwickshire.")
AVON = Passage("3", "River Avon", "A river in England.")


def test_single_query_block_is_rag_r1s_numbered_documents(tokenizer: Any) -> None:
    block = InformationFormat(tokenizer, 0).block(["Hamlet author"], [[HAMLET, STRATFORD]], multi_query=False)
    assert block == (
        '\n<information>\nDoc 1: "Hamlet"\nA tragedy by William Shakespeare.\n'
        'Doc 2: "Stratford-upon-Avon"\nA market town in Warwickshire.\n</information>\n'
    )


def test_multi_query_block_says_which_documents_answer_which_query(tokenizer: Any) -> None:
    block = InformationFormat(tokenizer, 0).block(
        ["Hamlet author", "Shakespeare birthplace"], [[HAMLET], [STRATFORD, AVON]], multi_query=True
    )
    assert block.startswith(INFORMATION_OPEN) and block.endswith(INFORMATION_CLOSE)
    body = json.loads(block[len(INFORMATION_OPEN) : -len(INFORMATION_CLOSE)])
    assert body == {
        "query": ["Hamlet author", "Shakespeare birthplace"],
        "documents": [documents([HAMLET]), documents([STRATFORD, AVON])],
    }
    assert body["documents"][1].startswith('Doc 1: "Stratford-upon-Avon"')  # numbered per query


def test_each_of_three_queries_gets_its_own_budget(tokenizer: Any) -> None:
    long = [Passage(str(i), f"Page {i}", "word " * 400) for i in range(3)]
    fmt = InformationFormat(tokenizer, 50)
    block = fmt.block(["a", "b", "c"], [long, long, long], multi_query=True)
    body = json.loads(block[len(INFORMATION_OPEN) : -len(INFORMATION_CLOSE)])
    # The third query is shown as much as the first (one shared budget starved it before).
    sizes = [len(tokenizer.encode(d, add_special_tokens=False)) for d in body["documents"]]
    assert all(48 <= n <= 50 for n in sizes), sizes
    assert all(d.startswith('Doc 1: "Page 0"') for d in body["documents"])


def test_each_shown_passage_comes_with_the_part_of_its_text_the_cut_left(tokenizer: Any) -> None:
    """What the SFT trajectories judge "shown" by: a passage cut mid-text is shown up to the cut, one whose title
    line the cut removed is not shown at all; single-query mode numbers one list across its queries."""
    long = Passage("5", "Long page", "word " * 200)
    budget = len(tokenizer.encode(documents([HAMLET]) + '\nDoc 2: "Long page"\nword word', add_special_tokens=False))
    fmt = InformationFormat(tokenizer, budget)
    shown = fmt.shown_passages([[HAMLET, long, AVON], [STRATFORD]], multi_query=True)
    assert [(p.title, text) for p, text in shown] == [
        ("Hamlet", "A tragedy by William Shakespeare."), ("Long page", "word word"),
        ("Stratford-upon-Avon", "A market town in Warwickshire.")]
    whole = InformationFormat(tokenizer, 0).shown_passages([[HAMLET], [STRATFORD, AVON]], multi_query=False)
    assert [(p.title, text) for p, text in whole] == [(p.title, p.text) for p in (HAMLET, STRATFORD, AVON)]


def test_short_documents_are_not_cut_and_non_ascii_stays_readable(tokenizer: Any) -> None:
    accented = Passage("4", "Gabriel García Márquez", "Colombian novelist.")
    block = InformationFormat(tokenizer, 480).block(["author"], [[accented]], multi_query=True)
    assert "García Márquez" in block and "\\u00" not in block
    assert json.loads(block[len(INFORMATION_OPEN) : -len(INFORMATION_CLOSE)])["documents"] == [documents([accented])]


def test_layout_overhead_stays_within_what_the_context_check_assumes(tokenizer: Any) -> None:
    """Real passages and queries of up to 16 tokens: what a block adds beyond the documents' budgets
    is at most BLOCK_OVERHEAD_TOKENS + 3 x QUERY_OVERHEAD_TOKENS, so 4 searches fit the context check."""
    rows = list(read_jsonl(corpus_path(), limit=3000))
    rng = random.Random(0)
    fmt = InformationFormat(tokenizer, 480)
    worst = 0
    for _ in range(40):
        queries = [" ".join(rng.choice(rows)["title"].split()[:4]) + " history and notable works" for _ in range(3)]
        results = [[Passage(r["id"], r["title"], r["text"]) for r in rng.sample(rows, 3)] for _ in queries]
        block = len(tokenizer.encode(fmt.block(queries, results, multi_query=True), add_special_tokens=False))
        documents_tokens = sum(
            len(tokenizer.encode(fmt.cut(documents(r)), add_special_tokens=False)) for r in results
        )
        worst = max(worst, block - documents_tokens)
    assert worst <= BLOCK_OVERHEAD_TOKENS + 3 * QUERY_OVERHEAD_TOKENS, worst
