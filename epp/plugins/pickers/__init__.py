"""Pickers: choose the targets from the weighted scores."""
