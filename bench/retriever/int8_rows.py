"""The int8 encoder's rows one a call against length-sorted chunks of 8: what a query's vector does, and the cost.

    PYTHONPATH=. .venv/bin/python bench/retriever/int8_rows.py [--questions 96] [--rounds 20]

The ``onnx-int8`` backend quantises each call's activations with one scale, so a row batched with others gets
a vector that depends on them; ``Encoder`` therefore runs that backend's queries one a call. This script runs the
shipped all-MiniLM-L6-v2 export both ways in the same run (chunks of 8 rows, the float backends' rule, is the
baseline) on the shipped questions and corpus, and prints:

1. how far a question's vector moves between encoding it alone and in a batch of 8 and of 48 (the smallest
   cosine), and how many top-3 passage lists over the first ``--passages`` passages change with it;
2. the time of a 1-, 3- and 48-question call at 1 thread (the router's default ``encoder_threads``) and at
   every core, and of 64 passages of 128 tokens at every core one a call (what running passages alone
   would cost an index build, which keeps its chunks): median ms of ``--rounds``
   calls interleaved with the baseline's, and the ratio alone / chunked.
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from bench.common import header
from bench.retriever.throughput import interleaved
from ragr1.services.retriever.corpus import read_corpus
from ragr1.services.retriever.encoder import DEFAULT_ENCODER, Encoder, preset
from ragr1.shipped import corpus_path, read_jsonl, train_path

CHUNK = 8


def encoders(threads: int, max_passage_tokens: int = 0) -> tuple[Encoder, Encoder]:
    """(rows alone, chunks of 8) of the int8 backend."""
    settings = preset(DEFAULT_ENCODER, "onnx-int8")
    if max_passage_tokens:
        settings = dataclasses.replace(settings, max_passage_tokens=max_passage_tokens)
    alone = Encoder(settings, device="cpu", threads=threads)
    chunked = Encoder(settings, device="cpu", threads=threads)
    chunked.query_chunk_rows = CHUNK  # the rule an int8 encoder's queries no longer follow: the baseline
    assert alone.query_chunk_rows == 1
    alone.chunk_rows = 1  # passages: what one row a call would cost an index build
    return alone, chunked


def movement(questions: list[str], passages: list[str]) -> None:
    alone, chunked = encoders(threads=1)
    single = np.stack([alone.encode_queries([q])[0] for q in questions])
    keys = alone.encode_passages(passages)
    top_single = np.argsort(-(single @ keys.T), axis=1)[:, :3]
    for size in (CHUNK, 48):
        for name, enc in (("alone", alone), ("chunks of 8", chunked)):
            rows = np.concatenate([enc.encode_queries(questions[i : i + size]) for i in range(0, len(questions), size)])
            cosine = np.sum(rows * single, axis=1)
            top = np.argsort(-(rows @ keys.T), axis=1)[:, :3]
            changed = int(np.sum(np.any(top != top_single, axis=1)))
            print(f"batches of {size:2d}, {name:11s}: smallest cosine to the question alone {cosine.min():.6f}; "
                  f"top-3 changed for {changed} of {len(questions)}")


def cost(questions: list[str], passages: list[str], rounds: int) -> None:
    for threads in (1, 0):
        alone, chunked = encoders(threads)
        label = "1 thread" if threads == 1 else "all cores"
        for n in (1, 3, 48):
            batch = questions[:n]
            a, c = interleaved([lambda: alone.encode_queries(batch), lambda: chunked.encode_queries(batch)], rounds)  # noqa: B023
            print(f"{label:9s} {n:2d} questions: alone {a:7.2f} ms, chunks {c:7.2f} ms, ratio {a / c:.2f}")
    alone, chunked = encoders(0, max_passage_tokens=128)
    block = passages[:64]
    calls = [lambda: alone.encode_passages(block), lambda: chunked.encode_passages(block)]
    a, c = interleaved(calls, max(rounds // 4, 3))
    print(f"all cores 64 passages (128 tokens): alone {a:7.1f} ms, chunks {c:7.1f} ms, ratio {a / c:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=96)
    parser.add_argument("--passages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    print(header())
    questions = [q["question"] for q in read_jsonl(train_path("hotpotqa"), limit=args.questions)]
    passages = [p.contents for p in read_corpus([corpus_path()], limit=args.passages)]
    movement(questions, passages)
    cost(questions, passages, args.rounds)


if __name__ == "__main__":
    main()
