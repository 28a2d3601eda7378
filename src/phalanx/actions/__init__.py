"""Actions: one module each, run in profile order inside a cycle."""
