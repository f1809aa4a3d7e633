"""The topic-lifecycle bench: ``python -m bench.lifecycle`` (``bench.lifecycle.run``)."""
