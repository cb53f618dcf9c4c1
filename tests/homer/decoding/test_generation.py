import pytest

from homer_integrations.homer.decoding.generation import GenerationOptions, StopStringFilter


def feed_all(stops, pieces):
    f = StopStringFilter(stops)
    text, out = "", []
    for p in pieces:
        text += p
        piece, stopped = f.feed(text)
        out.append(piece)
        if stopped:
            return "".join(out), True
    return "".join(out) + f.flush(text), False


def test_stop_string_is_cut_even_when_split_across_pieces():
    assert feed_all(("END",), ["Hello E", "N", "D and more"]) == ("Hello ", True)


def test_partial_stop_prefix_is_released_when_it_does_not_complete():
    assert feed_all(("END",), ["Hello E", "N", "x"]) == ("Hello ENx", False)


def test_no_stop_strings_stream_everything():
    assert feed_all((), ["a", "b"]) == ("ab", False)


def test_options_validate():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="max_new_tokens"):
        GenerationOptions(max_new_tokens=0)
    with pytest.raises(ValidationError, match="top_p"):
        GenerationOptions(top_p=0)
    assert GenerationOptions(temperature=0.7).sampling


def test_options_merge_settings_and_call_overrides_one_way():

    settings = {"max_tokens": 40, "temperature": 0.0, "stop": ["\n"], "seed": None}
    call = {"temperature": 0.7, "stop": None, "max_tokens": 12, "document": "not an option", "seed": 3}
    merged = GenerationOptions.merged(settings, call)
    assert (merged.max_new_tokens, merged.temperature, merged.stop, merged.seed) == (12, 0.7, ("\n",), 3)
    # max_new_tokens wins over max_tokens in the same layer; None never overrides
    assert GenerationOptions.merged({"max_new_tokens": 5, "max_tokens": 9}).max_new_tokens == 5
    assert GenerationOptions.merged(settings, {"max_tokens": None}).max_new_tokens == 40
    with pytest.raises(ValueError):
        GenerationOptions.merged(settings, {"top_p": 0.0})


def test_one_stop_string_is_one_stop_not_its_characters() -> None:
    """``stop="hello"`` was split into h, e, l, l, o: an answer was cut at its first 'h' (issue 82, item 8)."""
    from homer_integrations.homer.decoding.generation import GenerationOptions

    assert GenerationOptions.merged({"stop": "hello"}).stop == ("hello",)
    assert GenerationOptions(stop="hello").stop == ("hello",)
    assert GenerationOptions.merged({"stop": ["a", "bc"]}, {"max_tokens": 3}).stop == ("a", "bc")
    with pytest.raises(ValueError):
        GenerationOptions(stop=5)
