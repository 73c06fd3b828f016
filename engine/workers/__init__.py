"""Worker processes: each owns one pool on its device (prefill or decode)."""
