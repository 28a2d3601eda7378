"""Trace loaders: each turns a public trace into core model objects, with file:line errors on bad rows."""
