"""The example's member sensors (who consumes the stream)."""
