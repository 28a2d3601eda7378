"""The dashboard's and the report's shared look, and the dashboard page (plain HTML, CSS, JavaScript)."""

from importlib import resources


def asset(name: str) -> bytes:
    """A file of this folder (style.css, dashboard.html, dashboard.js)."""
    return (resources.files(__package__) / name).read_bytes()
