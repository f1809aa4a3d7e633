"""Fixtures of real peers (PostgreSQL, the local broker, the local v3io server) live in tests/fixtures/."""

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.kafka",
    "tests.fixtures.v3io",
]
