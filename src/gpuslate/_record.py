"""Wide immutable records built by keywords only, without ``dataclasses``.

A result with a dozen fields built positionally lets two fields of one type trade places
unseen (``ClearResult``'s ``before`` and ``after``, both ``list[GpuReading]``: mypy passes
either order). A ``NamedTuple`` cannot refuse positions; ``@dataclass(kw_only=True)`` can, but
importing ``dataclasses`` (with ``inspect``, ``ast``...) costs about 10 ms at every start of
``gpuslate clear``, whose path imports none of them. So a record on that path is a plain
class with ``__slots__``, a keyword-only ``__init__`` written out (mypy checks every call) that
hands its arguments to :meth:`Record._fill`, and what a NamedTuple gave its users: equality,
a ``repr``, ``_replace`` and ``_asdict``. Assigning to a field afterwards raises, as it did.
"""

from __future__ import annotations

from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """Base of a keyword-only record: subclasses list their fields in ``__slots__``, in order."""

    __slots__: tuple[str, ...] = ()

    def _fill(self, values: dict[str, Any]) -> None:
        """Set every field from ``values`` (the ``__init__``'s ``locals()``), once."""
        for name in self.__slots__:
            object.__setattr__(self, name, values[name])

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable: use _replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _asdict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def _replace(self: R, **changes: Any) -> R:
        return type(self)(**{**self._asdict(), **changes})

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self.__slots__)})"
