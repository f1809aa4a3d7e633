"""The chaos run: faults injected into a real deployment (``dagster dev``, broker, PostgreSQL, Spark Connect)
while it consumes a stream, checked against what the stream function itself recorded (``bench.chaos.run``)."""
