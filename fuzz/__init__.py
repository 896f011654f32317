"""Coverage-guided fuzzing (atheris) of what clients, config authors and pods send: `make fuzz`."""
