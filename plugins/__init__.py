"""Built-in plugins. Importing this package registers every built-in type with the framework registry."""
