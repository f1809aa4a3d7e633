"""A v3io-compatible server (streams, KV items, objects, directories) backed by SQLite.

It speaks the v3io web API as the real ``v3io`` client sends it, so the v3io path of the project can be
tried and tested without an Iguazio platform. Start it with ``streamgroup local v3io --data DIR`` or,
in tests, with :func:`dagster_streamgroup.local.v3io.testing.running_v3io_server`.
"""
