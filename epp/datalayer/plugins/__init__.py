"""The data layer's plugin types (`dataLayer.sources`): they configure the metrics scraper."""
