"""Identifiers that address result partitions across processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, order=True)
class PartitionId:
    """One map output: ``(app_id, shuffle_id, map_index, attempt)``.

    The Spark layer maps (application, shuffle, map task attempt) onto it; the engine only
    needs equality, hashing and a wire form.
    """

    app_id: str
    shuffle_id: int
    map_index: int
    attempt: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {
            "app": self.app_id,
            "shuffle": self.shuffle_id,
            "map": self.map_index,
            "attempt": self.attempt,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> PartitionId:
        return cls(str(data["app"]), int(data["shuffle"]), int(data["map"]), int(data["attempt"]))

    def __str__(self) -> str:
        return f"{self.app_id}/s{self.shuffle_id}/m{self.map_index}a{self.attempt}"
