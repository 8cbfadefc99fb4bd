"""What a straight-line request's ``then`` was told, for the schedulers' ``enqueue`` tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Told:
    """What ``then`` was told, in order: ``number`` of the output ``name``'s first element, or the error."""

    def __init__(self, name: str, number: Callable[[Any], float | int]) -> None:
        self._name = name
        self._number = number
        self.outcomes: list[tuple[float | int | None, BaseException | None]] = []

    def then(self, results, error) -> None:
        self.outcomes.append((None if results is None else self._number(results[self._name][0, 0]), error))
