"""Text of a live page, read in one step.

The dashboard redraws its sections as the board changes: an element found by one WebDriver call
may be replaced before the next reads its `.text` (StaleElementReferenceException, seen once in
a loaded CI run). The page's own JavaScript reads find and text together, so a redraw falls
before or after it, never between.
"""

from __future__ import annotations

from typing import Any, cast


def texts(chrome: Any, css: str) -> list[str]:
    """The innerText of every element matching `css`, now."""
    script = "return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText);"
    return cast(list[str], chrome.execute_script(script, css))


def text(chrome: Any, css: str) -> str:
    """The innerText of the first element matching `css`; "" when there is none."""
    found = texts(chrome, css)
    return found[0] if found else ""
