"""Profile handlers: which scheduling profiles run, and which result is primary."""
