"""Admitters: reject a request after the data producers ran, before scheduling."""
