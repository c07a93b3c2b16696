"""Text splitting shared by synthesis and the data sets: sentences, long ones cut at soft breaks.

Like CosyVoice's front end, a long text is synthesized sentence by sentence, which keeps each LLM
sequence (and the memory it needs) bounded whatever the text's length. Torch-free.
"""

from __future__ import annotations

import re

DEFAULT_MAX_CHARS = 80

# A sentence ends at 。！？ (a run of them) or at . ! ? followed by a space or the end of the text, so
# that "3.14" and "e.g.x" stay whole; closing quotes and brackets after the mark stay with the sentence.
_SENTENCE_END = re.compile(r"(?:[。！？]+|[.!?]+(?=\s|$))[\"'”’」』)）\]]*")
_SOFT_BREAK = re.compile(r"[,;:，；：、]\s*|\s+")


def text_weight(text: str) -> int:
    """Length in English-character equivalents: a CJK character takes about as long to say as 3 Latin ones."""
    return sum(3 if ord(c) >= 0x2E80 else 1 for c in text)


def split_text(text: str, max_chars: int = DEFAULT_MAX_CHARS) -> list[str]:
    """Pieces of ``text`` to synthesize one at a time: sentences, long ones cut at soft breaks.

    Whitespace runs become one space (line breaks of a text file are not pauses). Consecutive
    short sentences are joined while they fit in ``max_chars`` (:func:`text_weight`), so a piece
    keeps the prosody of its sentences; a sentence longer than that is cut after the last comma,
    semicolon, colon or space that fits, or hard at the limit when there is none.
    """
    text = " ".join(text.split())
    sentences, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        sentences.append(text[start:m.end()].strip())
        start = m.end()
    sentences.append(text[start:].strip())
    pieces: list[str] = []
    for sentence in filter(None, sentences):
        for part in _cut(sentence, max_chars):
            if pieces and text_weight(pieces[-1]) + 1 + text_weight(part) <= max_chars:
                pieces[-1] = f"{pieces[-1]} {part}" if _spaced(pieces[-1], part) else pieces[-1] + part
            else:
                pieces.append(part)
    return pieces


def _spaced(left: str, right: str) -> bool:
    """Whether two joined pieces need a space between them (not between two CJK characters)."""
    return not (ord(left[-1]) >= 0x2E80 and ord(right[0]) >= 0x2E80)


def _cut(sentence: str, max_chars: int) -> list[str]:
    """``sentence`` in parts of at most ``max_chars`` (weighted), cut at soft breaks where possible.

    One pass with a moving start and a running weight: each part costs O(max_chars), so a megabyte
    without a sentence end splits in linear time (re-weighing and re-slicing the rest per part was
    quadratic: minutes for a long text file)."""
    weights = [3 if ord(c) >= 0x2E80 else 1 for c in sentence]
    n, pos, remaining = len(sentence), 0, sum(weights)
    out = []
    while remaining > max_chars:
        # Longest part within the limit, then back to its last soft break (keeping the punctuation).
        end, weight = pos, 0
        while end < n and weight + weights[end] <= max_chars:
            weight += weights[end]
            end += 1
        breaks = [m.end() for m in _SOFT_BREAK.finditer(sentence, pos, end) if m.end() > pos]
        cut = breaks[-1] if breaks and breaks[-1] - pos > (end - pos) // 3 else max(end, pos + 1)
        out.append(sentence[pos:cut].strip())
        remaining -= sum(weights[pos:cut])
        pos = cut
        while pos < n and sentence[pos].isspace():  # the rest starts at its first non-space
            remaining -= weights[pos]
            pos += 1
    if pos < n:
        out.append(sentence[pos:].strip())
    return [p for p in out if p]
