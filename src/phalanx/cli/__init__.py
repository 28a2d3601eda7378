"""The `phalanx` command."""
