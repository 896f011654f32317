"""Endpoint discovery: sources that keep the Datastore equal to the pool's ready endpoints."""
