"""The window convention's one conversion (decode_conformance.cases.visible_keys_of /
window_for), which cases, the case generators, the fuzzer and the dispatcher's gate all use."""
import pytest

from decode_conformance.cases import WINDOW_CONVENTIONS, visible_keys_of, window_for


@pytest.mark.parametrize("convention, window, visible", [
    ("counts-current", 1, 1), ("counts-current", 64, 64),  # vLLM / sglang: the window counts the query's token
    ("excludes-current", 1, 2), ("excludes-current", 63, 64),  # flashinfer window_left / FlashAttention left
])
def test_visible_keys_and_back(convention, window, visible):
    assert visible_keys_of(window, convention) == visible
    assert window_for(visible, convention) == window


@pytest.mark.parametrize("convention", WINDOW_CONVENTIONS)
def test_no_window_is_every_key_in_both_conventions(convention):
    assert visible_keys_of(None, convention) is None and window_for(None, convention) is None


@pytest.mark.parametrize("fn", [visible_keys_of, window_for])
def test_an_unknown_convention_is_named(fn):
    with pytest.raises(ValueError, match=r"window convention: expected one of .*got 'left'"):
        fn(5, "left")
