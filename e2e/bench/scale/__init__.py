"""Under load and size: replicas side by side, long soaks, large request bodies."""
