"""Conformance tests of the local v3io-compatible server, driven through the real ``v3io`` client."""
