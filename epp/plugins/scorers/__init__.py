"""Scorers: one score in [0, 1] per candidate."""
