"""dagster-streamgroup."""
