"""Request parsers (parser.pluginRef)."""
