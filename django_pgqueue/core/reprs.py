"""Values quoted in error messages."""

from __future__ import annotations

from typing import Any


def short_repr(value: Any) -> str:
    """``repr(value)`` cut to 60 characters, for error messages; safe for huge ints."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an int of {value.bit_length()} bits"  # repr() may refuse to print it
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
