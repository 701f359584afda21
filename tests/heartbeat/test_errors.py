"""The exception tree drawn in ``heartbeat/errors.py``'s docstring is the tree of its classes."""

from __future__ import annotations

import inspect
import re

import heartbeat
from heartbeat import errors

_NAME = re.compile(r"[A-Z]\w+")


def _drawn_tree() -> dict[str, str | None]:
    """Each class named in the drawing, with the class drawn as its parent (None for the root)."""
    doc = errors.__doc__ or ""
    block = doc.split("::", 1)[1].strip("\n").split("\n\n", 1)[0]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        match = _NAME.search(line)
        assert match, line
        depth, name = match.start(), match.group()  # how far the name is indented is its depth
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def _classes() -> dict[str, type[BaseException]]:
    return {
        name: cls
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, BaseException) and cls.__module__ == errors.__name__
    }


def test_every_class_is_drawn_under_its_own_base() -> None:
    drawn = _drawn_tree()
    classes = _classes()
    assert set(drawn) == set(classes)
    for name, parent in drawn.items():
        ours = [b.__name__ for b in classes[name].__bases__ if b.__name__ in classes]
        assert ours == ([] if parent is None else [parent]), name


def test_one_root_and_every_class_is_exported() -> None:
    assert [name for name, parent in _drawn_tree().items() if parent is None] == ["HeartbeatError"]
    assert all(issubclass(cls, errors.HeartbeatError) for cls in _classes().values())
    assert set(_classes()) <= set(heartbeat.__all__)


def test_the_config_error_is_also_a_value_error() -> None:
    assert issubclass(errors.HeartbeatConfigError, ValueError)
    assert "HeartbeatConfigError (also ValueError)" in (errors.__doc__ or "")
