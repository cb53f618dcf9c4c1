"""Sources: the document's units an answer attended to most, cited as character spans."""

from __future__ import annotations

import torch

from homer_integrations.homer.decoding.sources import CitedSpan, cite, units

TEXT = "First paragraph here.\n\nSecond one, a bit longer.\n\n  \n\nThird.\n\nFourth and last."


def word_offsets(text: str) -> torch.Tensor:
    """[N, 2] character spans of ``text``'s whitespace-separated words: a stand-in tokenizer's offsets."""
    spans, start = [], None
    for i, ch in enumerate(text + " "):
        if not ch.isspace() and start is None:
            start = i
        elif ch.isspace() and start is not None:
            spans.append((start, i))
            start = None
    return torch.tensor(spans)


def test_units_cover_the_paragraphs_and_cut_long_ones_at_sentence_ends() -> None:
    spans = units(TEXT).tolist()
    assert [TEXT[a:b] for a, b in spans] == [
        "First paragraph here.",
        "Second one, a bit longer.",
        "Third.",
        "Fourth and last.",
    ]
    long = " ".join(f"Sentence number {i} is here." for i in range(200))
    cut = units(long, longest=300)
    assert cut.shape[0] > 5 and int(cut[0, 0]) == 0 and int(cut[-1, 1]) == len(long)
    assert all(long[int(b) - 2 : int(b)] in (". ", "re") for _, b in cut[:-1].tolist())
    assert all(int(cut[i, 1]) == int(cut[i + 1, 0]) for i in range(cut.shape[0] - 1))
    assert all(300 <= int(b) - int(a) <= 330 for a, b in cut[:-1].tolist())


def test_the_most_attended_units_are_cited_in_document_order() -> None:
    offsets = word_offsets(TEXT)  # 12 words: 3, 5, 1, 3 per paragraph
    origin = torch.cat([torch.tensor([-1, -1]), torch.arange(12)])  # a prompt before the document
    attended = torch.zeros(14)
    attended[0] = 100.0  # the prompt's attention sink is never cited
    attended[2 + 8] = 4.0  # "Third."
    attended[2 + 0] = 3.0  # "First"
    attended[2 + 11] = 0.5  # "last." under a quarter of the best: not cited
    sources = cite(attended, origin, offsets, TEXT)
    assert [(TEXT[s.start : s.end]) for s in sources] == ["First paragraph here.", "Third."]
    assert abs(sum(s.score for s in sources) - 7.0 / 7.5) < 1e-6
    third = TEXT.index("Third.")
    assert cite(attended, origin, offsets, TEXT, most=1) == [CitedSpan(third, third + 6, 4.0 / 7.5)]


def test_neighbouring_cited_units_join_and_an_unattended_document_cites_nothing() -> None:
    offsets = word_offsets(TEXT)
    origin = torch.arange(12)
    attended = torch.zeros(12)
    attended[8] = 1.0  # "Third."
    attended[9] = 1.0  # "Fourth"
    (joined,) = cite(attended, origin, offsets, TEXT)
    assert TEXT[joined.start : joined.end] == "Third.\n\nFourth and last." and abs(joined.score - 1.0) < 1e-6
    assert cite(torch.zeros(12), origin, offsets, TEXT) == []
    assert cite(attended, torch.full((12,), -1), offsets, TEXT) == []


def test_what_a_read_without_the_question_attends_to_is_not_cited() -> None:
    offsets = word_offsets(TEXT)
    origin = torch.arange(12)
    baseline = torch.zeros(12)
    baseline[0] = 6.0  # the document's first word draws attention whatever is asked
    baseline[11] = 2.0  # and the last, just before the question
    attended = baseline * 3  # the same pull, three times the rows
    attended[8] = 6.0  # "Third.": what the question adds
    assert [TEXT[s.start : s.end] for s in cite(attended, origin, offsets, TEXT)] == [
        "First paragraph here.",
        "Third.\n\nFourth and last.",  # neighbours joined
    ]
    (cited,) = cite(attended, origin, offsets, TEXT, baseline=baseline)
    assert TEXT[cited.start : cited.end] == "Third."
