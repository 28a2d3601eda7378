"""Errors that name what is wrong and where, so bad input never becomes a traceback."""

from __future__ import annotations


class SpecError(ValueError):
    """A malformed model object, manifest, annotation, trace row or config.

    `where` locates the problem (a field path, `file:line`, an object name) and
    `message` says what is wrong with it.
    """

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)

    def located(self, prefix: str) -> SpecError:
        """Return the same error with an outer location prepended."""
        where = (
            f"{prefix}.{self.where}" if self.where and not self.where.startswith("[") else prefix + self.where
        )
        return SpecError(where, self.message)
