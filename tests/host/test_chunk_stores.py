"""Chunk fills into the channels with plain or non-temporal stores, chosen per peer by measuring
them (csrc/host/chunk_stores.cc): messages of many chunks, both kinds used, results exact."""
import chunk_stores_cases as cases


def test_messages_of_many_chunks_with_both_kinds_of_store(pool):
    assert pool(4).run(cases.many_chunk_messages, 40, timeout=120) == [[]] * 4
