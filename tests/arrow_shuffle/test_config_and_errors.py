from __future__ import annotations

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


def test_exception_tree_matches_the_docstring() -> None:
    assert issubclass(SequenceGapError, errors.ShuffleProtocolError)
    assert issubclass(RemoteFailureError, PeerLostError)
    assert not issubclass(errors.ChannelClosedError, PeerLostError)
    doc = errors.__doc__ or ""
    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, errors.ShuffleError):
            assert name in doc, f"{name} missing from the drawn tree"
