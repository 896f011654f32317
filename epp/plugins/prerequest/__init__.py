"""PreRequest plugins that run after the pick, before the request is forwarded."""
