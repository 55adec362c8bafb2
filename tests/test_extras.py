"""Optional dependencies: a missing one is one clear error naming the extra."""

from __future__ import annotations

import pytest

import taps
from taps._support.extras import require
from taps.errors import MissingExtraError


def test_missing_module_names_the_extra():
    with pytest.raises(MissingExtraError, match=r"pip install 'taps\[plot\]'") as e:
        require("taps_no_such_module", "plot", "drawing figures")
    assert "drawing figures needs taps_no_such_module" in str(e.value)
    assert isinstance(e.value, taps.TapsError)


def test_present_module_is_returned():
    assert require("json", "plot", "anything").dumps([1]) == "[1]"
