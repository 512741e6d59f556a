"""Measurement: interleaved A/B timing, its statistics and verdicts (GPU samplers plug in as callables)."""
