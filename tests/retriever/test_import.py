"""``ragr1 index import``: an index in Search-R1's layout (FAISS written by FAISS, a ``contents`` JSONL
corpus) imported into shards answers through real shard servers and the router as FAISS answers on
the original file; and the query side encodes as Search-R1's retriever does, per encoder family."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import faiss
import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from ragr1.services.common.process import ServiceProcess
from ragr1.services.retriever.client import RetrieverClient
from ragr1.services.retriever.corpus import read_corpus
from ragr1.services.retriever.encoder import DEFAULT_ENCODER, Encoder, EncoderSettings, model_path
from ragr1.services.retriever.faiss_file import UnsupportedIndex, open_source
from ragr1.services.retriever.families import family_of, family_settings
from ragr1.services.retriever.importer import CountMismatch, import_index
from ragr1.services.retriever.ivf_file import IvfSource
from ragr1.services.retriever.manifest import LoadedManifest
from ragr1.services.retriever.router import Router, RouterSettings
from ragr1.services.retriever.shard import ShardSearcher, ShardSettings
from ragr1.shipped import corpus_path
from tests.retriever.processes import start_router, start_shards

PASSAGES = 240
TOP_K = 10


@dataclasses.dataclass
class SearchR1Layout:
    corpus: Path  # wiki-18.jsonl-like: {"id", "contents"} per line
    flat: Path  # e5_Flat.index-like
    hnsw: Path
    parts: list[Path]  # the same rows as two FAISS files
    l2: Path
    ivf: dict[str, Path]  # IVF-flat, IVF-PQ and a two-part IVF-PQ (one trained quantizer), probing 2 of 4 lists
    ivf_parts: list[Path]
    settings: EncoderSettings


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> SearchR1Layout:
    root = tmp_path_factory.mktemp("search-r1")
    passages = list(read_corpus([corpus_path()], limit=PASSAGES))
    corpus = root / "wiki.jsonl"
    with open(corpus, "w") as handle:
        for i, p in enumerate(passages):  # Search-R1's ids are line numbers; contents is '"Title"\ntext'
            handle.write(json.dumps({"id": str(i), "contents": f'"{p.title}"\n{p.text}'}) + "\n")
    # The E5 family's settings on the shipped model; short passages keep the embedding quick.
    settings = family_settings(DEFAULT_ENCODER, "e5")
    short = dataclasses.replace(settings, max_passage_tokens=64)
    vectors = Encoder(short, device="cpu").encode_passages([f'"{p.title}"\n{p.text}' for p in passages])
    flat = faiss.IndexFlatIP(vectors.shape[1])
    flat.add(vectors)
    faiss.write_index(flat, str(root / "e5_Flat.index"))
    hnsw = faiss.IndexHNSWFlat(vectors.shape[1], 16, faiss.METRIC_INNER_PRODUCT)
    hnsw.hnsw.efSearch = 256  # beam wider than the index: the graph search is exact here
    hnsw.add(vectors)
    faiss.write_index(hnsw, str(root / "e5_HNSW16.index"))
    parts = []
    for i, (a, b) in enumerate([(0, 100), (100, PASSAGES)]):
        part = faiss.IndexFlatIP(vectors.shape[1])
        part.add(vectors[a:b])
        parts.append(root / f"part{i}.index")
        faiss.write_index(part, str(parts[-1]))
    l2 = faiss.IndexFlatL2(vectors.shape[1])
    l2.add(vectors)
    faiss.write_index(l2, str(root / "l2.index"))
    ivf: dict[str, Path] = {}
    ivf_parts = []
    for kind, factory in (("ivfflat", "IVF4,Flat"), ("ivfpq", "IVF4,PQ16x4")):
        index = faiss.index_factory(vectors.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
        index.train(vectors)
        index.nprobe = 2  # FAISS writes it into the file; an approximate search, so the test means something
        trained = faiss.clone_index(index)
        index.add(vectors)
        ivf[kind] = root / f"e5_{factory.replace(',', '_')}.index"
        faiss.write_index(index, str(ivf[kind]))
    for i, (a, b) in enumerate([(0, 100), (100, PASSAGES)]):
        part = faiss.clone_index(trained)  # the last trained (IVF-PQ): parts share quantizer and codebooks
        part.add(vectors[a:b])
        ivf_parts.append(root / f"ivf-part{i}.index")
        faiss.write_index(part, str(ivf_parts[-1]))
    return SearchR1Layout(corpus, root / "e5_Flat.index", root / "e5_HNSW16.index", parts, root / "l2.index",
                          ivf, ivf_parts, settings)


def expected(original: Path, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores and rows of FAISS searching the original file, read whole as Search-R1's server does."""
    scores, rows = faiss.read_index(str(original)).search(queries, TOP_K)
    return scores, rows


# Shard and router processes serve Search-R1's usual index and compressed shards; the other kinds go through the same
# shard and router code in this process (the servers' transport is the same for every kind; the import is not).
SERVED = ("flat", "ivfpq")


@pytest.mark.parametrize("kind", ["flat", "hnsw", "two-part", "ivfflat", "ivfpq"])
def test_an_imported_index_answers_through_shards_and_router_as_faiss_on_the_original(
    kind: str, layout: SearchR1Layout, questions: list[str], tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    sources = {"flat": [layout.flat], "hnsw": [layout.hnsw], "two-part": layout.parts,
               "ivfflat": [layout.ivf["ivfflat"]], "ivfpq": [layout.ivf["ivfpq"]]}[kind]
    out = tmp_path / "index"
    import_index(sources, out, layout.settings, num_shards=3, corpus=[layout.corpus], chunk_rows=7, progress=False)
    loaded = LoadedManifest(out)
    m = loaded.manifest
    assert m.index.index_type == {"hnsw": "hnsw", "ivfflat": "ivfflat", "ivfpq": "ivfpq"}.get(kind, "flat")
    assert m.num_shards == 3
    assert m.encoder == layout.settings and m.index.metric == "ip"
    sample = questions[:24]
    encoder = Encoder(layout.settings, device="cpu")
    if kind in SERVED:
        shards = start_shards(out, 3, tmp_path, processes)
        router = start_router(out, shards, tmp_path, processes)
        with RetrieverClient(router["grpc"]) as client:
            reply = client.search(sample, TOP_K, omit_text=True, timeout=60)
        found = [[(p.id, p.score) for p in result.passages] for result in reply.results]
    else:
        found = search_in_process(loaded, encoder, sample)
    original = {"hnsw": layout.hnsw, **layout.ivf}.get(kind, layout.flat)
    assert_as_faiss(found, original, encoder.encode_queries(sample))


def search_in_process(loaded: LoadedManifest, encoder: Encoder, sample: list[str]) -> list[list[tuple[str, float]]]:
    """The router over in-process shard searchers (no servers): cheaper where the transport is not the point."""
    lower_is_better = loaded.manifest.index.metric == "l2"

    async def search() -> list[list[tuple[str, float]]]:
        searchers = [ShardSearcher(loaded, i, ShardSettings()) for i in range(loaded.manifest.num_shards)]

        class InProcess:
            def __init__(self, s: ShardSearcher) -> None:
                self.s = s

            async def search(self, embeddings: np.ndarray, top_k: int, omit_text: bool, timeout: float) -> list:
                return await self.s.search(embeddings, top_k, omit_text)

        # Each call's queries in one batch, as the FAISS search it is compared with.
        one_batch = RouterSettings(query_cache_size=0, encoder_workers=1, encoder_split_when_idle=False)
        router = Router(encoder, [InProcess(s) for s in searchers], one_batch, lower_is_better=lower_is_better)
        try:
            result = await router.search(sample, TOP_K)
            return [[(h.id, h.score) for h in hits] for hits in result.results]
        finally:
            await router.aclose()
            for s in searchers:
                await s.aclose()

    return asyncio.run(search())


def assert_as_faiss(found: list[list[tuple[str, float]]], original: Path, queries: np.ndarray) -> None:
    scores, rows = expected(original, queries)
    assert len(found) == len(queries)
    for q, hits in enumerate(found):
        assert [h[0] for h in hits] == [str(r) for r in rows[q]]
        np.testing.assert_allclose([h[1] for h in hits], scores[q], rtol=1e-5, atol=1e-5)


def test_an_l2_index_merges_its_shards_smallest_distance_first(layout: SearchR1Layout, questions: list[str],
                                                               tmp_path: Path) -> None:
    import_index([layout.l2], tmp_path / "l2", layout.settings, num_shards=3, corpus=[layout.corpus], progress=False)
    loaded = LoadedManifest(tmp_path / "l2")
    assert loaded.manifest.index.metric == "l2"
    encoder = Encoder(layout.settings, device="cpu")
    sample = questions[:12]
    assert_as_faiss(search_in_process(loaded, encoder, sample), layout.l2, encoder.encode_queries(sample))


def test_ivf_shards_stay_compressed_and_a_two_part_ivf_answers_as_the_whole(
    layout: SearchR1Layout, questions: list[str], tmp_path: Path
) -> None:
    out = tmp_path / "parts"
    import_index(layout.ivf_parts, out, layout.settings, num_shards=3, corpus=[layout.corpus], progress=False)
    loaded = LoadedManifest(out)
    assert (loaded.manifest.index.index_type, loaded.manifest.index.nlist, loaded.manifest.index.nprobe) == (
        "ivfpq", 4, 2)
    # The codes are copied, not decoded: every shard's lists hold 8-byte PQ codes, all rows once.
    shards = [IvfSource.open(loaded.shard_path(i)) for i in range(3)]
    assert {s.code_size for s in shards} == {8} and sum(int(s.sizes.sum()) for s in shards) == PASSAGES
    encoder = Encoder(layout.settings, device="cpu")
    sample = questions[:12]
    assert_as_faiss(search_in_process(loaded, encoder, sample), layout.ivf["ivfpq"], encoder.encode_queries(sample))
    # Parts trained apart have other centroids: one query would probe different lists in each.
    other = faiss.index_factory(loaded.manifest.dim, "IVF4,PQ16x4", faiss.METRIC_INNER_PRODUCT)
    other.train(np.random.default_rng(1).random((200, loaded.manifest.dim), dtype=np.float32))
    faiss.write_index(other, str(tmp_path / "other.index"))
    with pytest.raises(ValueError, match="different coarse quantizers"):
        import_index([layout.ivf_parts[0], tmp_path / "other.index"], tmp_path / "no", layout.settings,
                     corpus=[layout.corpus], progress=False)


def test_import_refuses_a_count_mismatch_and_indexes_it_cannot_split(layout: SearchR1Layout, tmp_path: Path) -> None:
    short = tmp_path / "short.jsonl"
    short.write_text("".join(layout.corpus.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(CountMismatch, match=rf"holds {PASSAGES} vectors, the corpus .* {PASSAGES - 1} passages"):
        import_index([layout.flat], tmp_path / "a", layout.settings, corpus=[short], progress=False)
    sq = faiss.index_factory(8, "IVF2,SQ8")
    sq.train(np.random.default_rng(0).random((100, 8), dtype=np.float32))
    faiss.write_index(sq, str(tmp_path / "sq.index"))
    with pytest.raises(UnsupportedIndex, match="cannot be imported"):
        open_source(tmp_path / "sq.index")
    ids = faiss.index_factory(8, "IVF2,Flat", faiss.METRIC_INNER_PRODUCT)
    x = np.random.default_rng(0).random((PASSAGES, 8), dtype=np.float32)
    ids.train(x)
    ids.add_with_ids(x, np.arange(PASSAGES) + 1000)
    faiss.write_index(ids, str(tmp_path / "ids.index"))
    with pytest.raises(ValueError, match="ids are not its row numbers"):
        import_index([tmp_path / "ids.index"], tmp_path / "b", layout.settings, corpus=[layout.corpus], progress=False)
    truncated = tmp_path / "truncated.index"
    truncated.write_bytes(layout.flat.read_bytes()[:-4])
    with pytest.raises(UnsupportedIndex, match="length field"):
        open_source(truncated)


def test_source_facts_are_read_from_the_file_as_faiss_wrote_them(layout: SearchR1Layout) -> None:
    hnsw = open_source(layout.hnsw)
    index = faiss.read_index(str(layout.hnsw))
    assert (hnsw.kind, hnsw.hnsw_m, hnsw.ef_search, hnsw.ef_construction) == (
        "hnsw", 16, 256, index.hnsw.efConstruction
    )
    np.testing.assert_array_equal(hnsw.rows(5, 9), index.storage.reconstruct_n(5, 4))
    assert open_source(layout.l2).metric == "l2" and open_source(layout.flat).metric == "ip"


# --- the query side, per family, against the documented behaviour implemented here with transformers ---


def reference_queries(queries: list[str], family: str) -> np.ndarray:
    """Search-R1's retrieval_server.py as documented: the family's prefix, tokenised to 256 tokens with
    padding, mean (masked) or CLS pooling, L2-normalised unless DPR."""
    prefix = {"e5": "query: ", "bge": "Represent this sentence for searching relevant passages: "}.get(family, "")
    path = model_path(DEFAULT_ENCODER)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    inputs = tokenizer([prefix + q for q in queries], max_length=256, padding=True, truncation=True,
                       return_tensors="pt")
    with torch.no_grad():
        hidden = model(**inputs).last_hidden_state
    if family == "e5" or family == "plain":
        mask = inputs["attention_mask"]
        pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(1) / mask.sum(1)[..., None]
    else:
        pooled = hidden[:, 0]
    if family != "dpr":
        pooled = torch.nn.functional.normalize(pooled, dim=-1)
    return pooled.numpy()


@pytest.mark.parametrize("family", ["e5", "bge", "dpr", "plain"])
def test_queries_are_encoded_as_search_r1s_retriever_encodes_them(family: str, questions: list[str]) -> None:
    sample = [*questions[:6], "a query with  extra   spaces ", "x" * 3000]  # the last is cut at 256 tokens
    ours = Encoder(family_settings(DEFAULT_ENCODER, family), device="cpu").encode_queries(sample)
    np.testing.assert_allclose(ours, reference_queries(sample, family), atol=2e-5)
    if family == "dpr":  # not normalised: the norms are the model's own
        assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-3)


def test_the_family_is_taken_from_the_name_as_search_r1_does() -> None:
    assert family_of("intfloat/e5-base-v2") == "e5" and family_of("/models/bge-large-en-v1.5") == "bge"
    assert family_of("facebook/dpr-question_encoder-single-nq-base") == "dpr" and family_of("contriever") == "plain"
    e5 = family_settings("intfloat/e5-base-v2")
    assert (e5.pooling, e5.normalize, e5.query_prefix, e5.max_query_tokens) == ("mean", True, "query: ", 256)
    assert family_settings("BAAI/bge-large-en-v1.5").pooling == "cls"
    assert family_settings("BAAI/bge-large-en-v1.5", pooling="mean").pooling == "mean"
    with pytest.raises(ValueError, match="encoder family must be one of"):
        family_settings("m", "colbert")


def test_the_command_imports_parts_and_refuses_in_one_line(tmp_path: Path) -> None:
    from tests.test_cli_errors import one_line_error, ragr1

    x = np.random.default_rng(0).random((5, 8), dtype=np.float32)
    for name, rows in (("a.index", x[:2]), ("b.index", x[2:])):
        part = faiss.IndexFlatIP(8)
        part.add(rows)
        faiss.write_index(part, str(tmp_path / name))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"T{i}"\ntext {i}'}) + "\n" for i in range(5)))
    common = ["index", "import", "--input", f"{tmp_path / 'a.index'},{tmp_path / 'b.index'}",
              "--encoder", "intfloat/e5-base-v2"]
    done = ragr1(*common, "--corpus", str(corpus), "--out", str(tmp_path / "ok"), "--num-shards", "2", cwd=tmp_path)
    assert done.returncode == 0 and "index imported" in done.stdout, done.stderr
    m = LoadedManifest(tmp_path / "ok").manifest
    assert [(s.start, s.end) for s in m.shards] == [(0, 2), (2, 5)] and m.encoder.query_prefix == "query: "
    short = tmp_path / "short.jsonl"
    short.write_text("".join(corpus.read_text().splitlines(keepends=True)[:4]))
    one_line_error(ragr1(*common, "--corpus", str(short), "--out", str(tmp_path / "no"), cwd=tmp_path),
                   "ragr1 index import", "holds 5 vectors", "4 passages")
    one_line_error(ragr1(*common, "--out", str(tmp_path / "no"), cwd=tmp_path),
                   "ragr1 index import", "give exactly one of corpus")
