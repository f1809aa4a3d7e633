"""The example's stream assets (what runs process)."""
