"""The harness itself, without the gate: Chroma starts and answers, the official
client works with explicit embeddings only, a 2,000 x 384 batch fits, and the
recorder passes traffic through faithfully. If these fail, the gated tests'
failures say nothing about the gate."""

from __future__ import annotations

import pytest
import requests

from recorder import Recorder
from support import BENIGN_DOCS, DIM, assert_vectors_close, unique_name, vectors

pytestmark = pytest.mark.e2e


def test_chroma_heartbeat_and_version(chroma_server, chroma_direct):
    r = requests.get(f"{chroma_server.url}/api/v2/heartbeat", timeout=5)
    assert r.status_code == 200
    assert isinstance(r.json()["nanosecond heartbeat"], int)
    assert chroma_direct.heartbeat() > 0
    assert isinstance(chroma_direct.get_version(), str)


def test_direct_add_get_query_with_explicit_embeddings(chroma_direct):
    col = chroma_direct.create_collection(unique_name("direct"), embedding_function=None)
    embs = vectors(3, seed=11)
    ids = ["b0", "b1", "b2"]
    col.add(
        ids=ids,
        embeddings=embs,
        documents=BENIGN_DOCS,
        metadatas=[{"source": "kb", "n": i} for i in range(3)],
    )
    assert col.count() == 3
    got = col.get(ids=ids, include=["documents", "metadatas", "embeddings"])
    by_id = dict(zip(got["ids"], range(3)))
    assert set(by_id) == set(ids)
    for i, rid in enumerate(ids):
        j = by_id[rid]
        assert got["documents"][j] == BENIGN_DOCS[i]
        assert got["metadatas"][j] == {"source": "kb", "n": i}
        assert_vectors_close([got["embeddings"][j]], [embs[i]])
    # Querying with a stored vector finds that record first, at distance ~0.
    q = col.query(query_embeddings=[embs[1]], n_results=3)
    assert q["ids"][0][0] == "b1"
    assert q["distances"][0][0] < 1e-6
    assert set(q["ids"][0]) == set(ids)
    col.delete(ids=["b0"])
    assert col.count() == 2
    chroma_direct.delete_collection(col.name)


def test_direct_batch_2000_by_384(chroma_direct):
    col = chroma_direct.create_collection(unique_name("big-direct"), embedding_function=None)
    n = 2000
    embs = vectors(n, DIM, seed=2000)
    ids = [f"r{i:05d}" for i in range(n)]
    col.add(
        ids=ids,
        embeddings=embs,
        documents=[f"record {i}" for i in range(n)],
        metadatas=[{"i": i} for i in range(n)],
    )
    assert col.count() == n
    got = col.get(ids=["r00000", "r01999"], include=["embeddings", "metadatas"])
    for rid, emb, md in zip(got["ids"], got["embeddings"], got["metadatas"]):
        i = int(rid[1:])
        assert md == {"i": i}
        assert_vectors_close([emb], [embs[i]])
    chroma_direct.delete_collection(col.name)


def test_recorder_passes_client_traffic_through(request, chroma_server):
    """client -> recorder -> chroma: the recorder must be transparent, or the
    upstream evidence of the gated tests is worthless."""
    import chromadb
    from chromadb.config import Settings

    rec = Recorder(("127.0.0.1", chroma_server.port))
    port = rec.start()
    try:
        client = chromadb.HttpClient(
            host="127.0.0.1", port=port, settings=Settings(anonymized_telemetry=False)
        )
        col = client.create_collection(unique_name("rec"), embedding_function=None)
        embs = vectors(2, 8, seed=5)
        col.add(ids=["x", "y"], embeddings=embs, documents=["doc x", "doc y"])
        assert col.count() == 2
        adds = rec.requests(f"/collections/{col.id}/add", "POST")
        assert len(adds) == 1
        ex = adds[0]
        assert ex.status == 201
        assert ex.framing == "content-length"
        assert ex.header("expect") is None
        body = ex.json()
        assert body["ids"] == ["x", "y"] and body["documents"] == ["doc x", "doc y"]
        assert rec.bodies_contain("doc y", str(col.id))
        # Keep-alive: every request of this client after construction on one connection.
        conns = {e.conn for e in rec.requests(str(col.id))}
        assert len(conns) == 1
        client.delete_collection(col.name)
    finally:
        rec.stop()


def test_no_default_embedding_function_reaches_the_network(chroma_direct):
    """Documents without embeddings make the client run the schema's default
    ONNX embedding function, which downloads a model. The session guard turns
    that into an immediate, explicit failure instead of a hang."""
    col = chroma_direct.create_collection(unique_name("guard"), embedding_function=None)
    col.add(ids=["g"], embeddings=vectors(1, 4, seed=3), documents=["guarded"])
    with pytest.raises(AssertionError, match="must not touch the network"):
        col.update(ids=["g"], documents=["no embeddings given"])
    assert col.get(ids=["g"])["documents"] == ["guarded"]
    chroma_direct.delete_collection(col.name)

