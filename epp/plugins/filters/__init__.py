"""Filters: narrow a profile's candidates."""
