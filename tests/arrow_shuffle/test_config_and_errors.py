from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from arrow_shuffle import (
    PeerLostError,
    RemoteFailureError,
    SequenceGapError,
    ShuffleConfig,
    ShuffleConfigError,
    errors,
)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("buffer_size", 100),
        ("exclusive_buffers_per_channel", 0),
        ("floating_buffers_per_gate", -1),
        ("flush_timeout_s", -0.1),
        ("peer_timeout_s", 0.5),
        ("max_frame_bytes", 10),
    ],
)
def test_invalid_values_name_the_field_and_range(field: str, value: float) -> None:
    with pytest.raises(ShuffleConfigError, match=rf"{field}=.*allowed"):
        ShuffleConfig(**{field: value})  # type: ignore[arg-type]


def test_defaults_follow_flink() -> None:
    config = ShuffleConfig()
    assert config.exclusive_buffers_per_channel == 2
    assert config.floating_buffers_per_gate == 8
    assert config.frame_limit == config.buffer_size


def _drawn_tree() -> dict[str, str]:
    """``{class: parent}`` as drawn in ``errors``' docstring (the root's parent is ``""``)."""
    parents: dict[str, str] = {}
    stack: list[str] = []
    for line in (errors.__doc__ or "").splitlines():
        match = re.match(r"^    ((?:[│ ]   )*)(?:[├└]── )?([A-Z]\w+Error)\b", line)
        if not match:
            continue
        depth = len(match.group(1)) // 4 + (1 if "──" in line else 0)
        del stack[depth:]
        parents[match.group(2)] = stack[-1] if stack else ""
        stack.append(match.group(2))
    return parents


def test_exception_tree_matches_the_docstring() -> None:
    assert issubclass(SequenceGapError, errors.ShuffleProtocolError)
    assert issubclass(RemoteFailureError, PeerLostError)
    assert not issubclass(errors.ChannelClosedError, PeerLostError)
    drawn = _drawn_tree()
    classes = {
        name: obj
        for name, obj in vars(errors).items()
        if isinstance(obj, type) and issubclass(obj, errors.ShuffleError)
    }
    assert set(drawn) == set(classes), "the drawn tree and the module's classes differ"
    for name, parent in drawn.items():
        first_base = classes[name].__bases__[0]
        assert first_base is (classes[parent] if parent else Exception), f"{name} drawn under {parent!r}"


def test_every_exception_of_the_package_lives_in_errors() -> None:
    """One tree for all of ``arrow_shuffle``, the Spark side included: no module defines its own."""
    package = Path(errors.__file__).parent
    defined = [
        f"{path.relative_to(package)}:{node.lineno} {node.name}"
        for path in sorted(package.rglob("*.py"))
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id.endswith(("Error", "Exception")) for b in node.bases)
    ]
    assert not defined, defined
    pytest.importorskip("pyspark")
    from spark_plugin.shuffle.worker import output_recovery

    assert vars(output_recovery)["MapOutputLostError"] is errors.MapOutputLostError
