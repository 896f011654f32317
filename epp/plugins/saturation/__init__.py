"""Saturation detectors: admission's view of pool load."""
