"""Request-lifecycle plugin types (admitters, request/response hooks)."""
