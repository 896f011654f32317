"""Plugin types of the anchors that pyepp recognizes only to refuse them with a clear config error."""
