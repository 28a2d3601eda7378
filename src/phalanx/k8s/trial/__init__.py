"""Trying Phalanx before switching: a cluster captured once (redacted if asked), one cycle replayed on it."""
