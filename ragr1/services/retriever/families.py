"""Query encoders as Search-R1's and RAG-R1's retrievers (FlashRAG's dense encoder) run them, per family.

Their retrieval server picks the family from the model's name: ``e5`` prefixes queries with
``"query: "`` (passages with ``"passage: "``), ``bge`` prefixes queries with BGE's retrieval
instruction, and every model but ``dpr`` ones is L2-normalised after pooling. Pooling is mean for
E5 and CLS for BGE and DPR-style models; queries are cut at 256 tokens. An index imported from
them must be queried the same way, or its inner products compare vectors from different spaces.
"""

from __future__ import annotations

from ragr1.services.retriever.encoder import POOLING_MODES, PRESETS, EncoderSettings

FAMILIES = ("auto", "e5", "bge", "dpr", "plain")
E5_QUERY_PREFIX = "query: "
E5_PASSAGE_PREFIX = "passage: "
BGE_QUERY_INSTRUCTION = PRESETS["BAAI/bge-large-en-v1.5"].query_prefix
# retrieval_server.py's retrieval_query_max_length; index_builder.sh's --max_length for passages.
SEARCH_R1_QUERY_TOKENS = 256
SEARCH_R1_PASSAGE_TOKENS = 256


def family_of(name: str) -> str:
    """The family Search-R1 would take ``name`` for: a substring test on the lower-cased name, in its order."""
    lowered = name.lower()
    for family in ("e5", "bge", "dpr"):
        if family in lowered:
            return family
    return "plain"


def family_settings(
    name: str,
    family: str = "auto",
    *,
    pooling: str = "",
    max_query_tokens: int = SEARCH_R1_QUERY_TOKENS,
    backend: str = "torch",
) -> EncoderSettings:
    """Encoder settings for ``name`` as the family's retriever encodes queries; ``pooling`` overrides."""
    if family not in FAMILIES:
        raise ValueError(f"encoder family must be one of {FAMILIES}, got {family!r}")
    if pooling and pooling not in POOLING_MODES:
        raise ValueError(f"pooling must be one of {POOLING_MODES}, got {pooling!r}")
    family = family_of(name) if family == "auto" else family
    base = {
        "e5": EncoderSettings(name, "mean", True, E5_QUERY_PREFIX, E5_PASSAGE_PREFIX),
        "bge": EncoderSettings(name, "cls", True, BGE_QUERY_INSTRUCTION),
        "dpr": EncoderSettings(name, "cls", False),
        "plain": EncoderSettings(name, "mean", True),
    }[family]
    return EncoderSettings(
        name,
        pooling or base.pooling,
        base.normalize,
        base.query_prefix,
        base.passage_prefix,
        max_query_tokens=max_query_tokens,
        max_passage_tokens=SEARCH_R1_PASSAGE_TOKENS,
        backend=backend,
    )
