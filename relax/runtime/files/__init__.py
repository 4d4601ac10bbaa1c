"""What a run writes and prints: its run directory, checkpoint files, metrics.jsonl and trackers, the
console lines and the error reports.
"""
