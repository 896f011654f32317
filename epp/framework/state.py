"""Typed state that plugins exchange: `DataKey[T]` names a value of type T in a `DataMap`.

A request carries one `DataMap` (`InferenceRequest.data`) from the first DataProducer to the last response hook;
each scheduling cycle has its own (`CycleState`). Keys are objects, not strings, so a reader and a writer agree on
the value's type, and a typo is a NameError instead of a silent miss. Producers and consumers declare the keys
they write and read (`Plugin.produces()` / `consumes()`): the config builder orders producers by them and rejects
a consumer whose producer is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")


class DataKey(Generic[T]):
    """The name of one typed value. Keys with equal names are the same key (modules may rebuild them)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        if not name:
            raise ValueError("a DataKey needs a name")
        self.name = name

    def of(self, producer: str) -> DataKey[T]:
        """This kind of value as written by the plugin named `producer` (e.g. one prefix producer of several)."""
        return DataKey(f"{self.name}/{producer}")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DataKey) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"DataKey({self.name!r})"


class DataMap:
    """Values by DataKey. Reads of a missing key give None (or raise, with `require`)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[DataKey[Any], Any] | None = None) -> None:
        self._values: dict[str, Any] = {k.name: v for k, v in values.items()} if values else {}

    def get(self, key: DataKey[T]) -> T | None:
        return cast("T | None", self._values.get(key.name))

    def require(self, key: DataKey[T]) -> T:
        try:
            return cast("T", self._values[key.name])
        except KeyError:
            raise KeyError(f"no value for {key.name!r}") from None

    def put(self, key: DataKey[T], value: T) -> None:
        self._values[key.name] = value

    def pop(self, key: DataKey[T]) -> T | None:
        return cast("T | None", self._values.pop(key.name, None))

    def update(self, other: DataMap) -> bool:
        """Copy `other`'s values in; True if any value was new or different."""
        mine = self._values
        changed = any(k not in mine or (mine[k] is not v and mine[k] != v) for k, v in other._values.items())
        mine.update(other._values)
        return changed

    def __contains__(self, key: object) -> bool:
        return isinstance(key, DataKey) and key.name in self._values

    def __len__(self) -> int:
        return len(self._values)

    def names(self) -> list[str]:
        """The names of the keys present (for logs and debugging)."""
        return sorted(self._values)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.names()})"


class CycleState(DataMap):
    """Scratch data of one scheduling cycle (filters, scorers, pickers and the profile handler of one Schedule call).

    Data that must outlive the cycle (for PreRequest or response hooks) belongs in `InferenceRequest.data`.
    """

    __slots__ = ()
