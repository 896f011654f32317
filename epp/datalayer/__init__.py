"""The data layer: per-endpoint scrapers of model-server metrics that keep Endpoint.metrics current."""
