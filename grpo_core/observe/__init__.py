"""What a step reports: the metrics stream (metrics), experiment trackers
(tracking), run-health warnings (health), held-out evaluation (evaluate).
"""
