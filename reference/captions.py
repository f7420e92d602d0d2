"""Word-level caption tokenizer and caption parser for the scenes domain.

The vocabulary is closed: it is exactly the words the caption grammar uses, plus <pad> and <null> (the
unconditional caption for classifier-free guidance). Unknown words are an error that names them: a
text-to-image model that silently drops "magenta" would draw something the user did not ask for.
"""

from __future__ import annotations

import re

from .scenes import BACKGROUNDS, BG_COLOURS, COLOURS, FILLS, POSITIONS, SHAPES, SIZES, Scene, SceneObject

MAX_CAPTION_TOKENS = 36
PAD, NULL = "<pad>", "<null>"


class CaptionError(ValueError):
    """A caption that cannot be encoded or parsed; the message says what is wrong."""


def _grammar_words() -> list[str]:
    words = {"a", "at", "the", "and", ",", "on", "background"}
    for group in (SHAPES, COLOURS, SIZES, FILLS, BACKGROUNDS, BG_COLOURS):
        words.update(group)
    for p in POSITIONS:
        words.update(p.split())
    return sorted(words)


VOCAB: list[str] = [PAD, NULL] + _grammar_words()
_INDEX = {w: i for i, w in enumerate(VOCAB)}
_SPLIT = re.compile(r"[a-z]+|,")


def words(caption: str) -> list[str]:
    """Lower-case words and commas; other punctuation is ignored."""
    return _SPLIT.findall(caption.lower())


def encode(caption: str) -> list[int]:
    """Caption -> MAX_CAPTION_TOKENS ids, right-padded with <pad>."""
    if not isinstance(caption, str) or not caption.strip():
        raise CaptionError("empty caption: describe at least one object, e.g. 'a large red circle at the center'")
    ws = words(caption)
    unknown = sorted({w for w in ws if w not in _INDEX})
    if unknown:
        raise CaptionError(f"unknown words {unknown}; the reference model knows only: {' '.join(VOCAB[2:])}")
    if len(ws) > MAX_CAPTION_TOKENS:
        raise CaptionError(f"caption has {len(ws)} tokens; the reference model takes at most {MAX_CAPTION_TOKENS}")
    ids = [_INDEX[w] for w in ws]
    return ids + [_INDEX[PAD]] * (MAX_CAPTION_TOKENS - len(ids))


def null_caption() -> list[int]:
    """The unconditional caption used for CFG (and for condition dropout in training)."""
    return [_INDEX[NULL]] + [_INDEX[PAD]] * (MAX_CAPTION_TOKENS - 1)


def decode(ids: list[int]) -> str:
    return " ".join(VOCAB[i] for i in ids if VOCAB[i] not in (PAD, NULL)).replace(" ,", ",")


_OBJ = re.compile(
    rf"^a ({'|'.join(SIZES)}) (?:({'|'.join(f for f in FILLS if f != 'plain')}) )?({'|'.join(COLOURS)}) "
    rf"({'|'.join(SHAPES)}) at the ({'|'.join(POSITIONS)})$"
)
_BG = re.compile(rf"^(.*) on a ({'|'.join(BACKGROUNDS)}) ({'|'.join(BG_COLOURS)}) background$")


def parse(caption: str) -> Scene:
    """Caption -> the Scene spec it describes (no jitter, texture seed 0). Raises CaptionError."""
    text = " ".join(words(caption)).replace(" ,", ",")
    m = _BG.match(text)
    if not m:
        raise CaptionError(f"caption does not end in 'on a <kind> <colour> background': {caption!r}")
    body, bg, bgc = m.groups()
    parts = re.split(r", | and ", body)
    objs = []
    for part in parts:
        om = _OBJ.match(part)
        if not om:
            raise CaptionError(f"cannot parse object phrase {part!r} in {caption!r}")
        size, fill, colour, shape, pos = om.groups()
        objs.append(SceneObject(shape, colour, size, fill or "plain", POSITIONS.index(pos)))
    cells = [o.cell for o in objs]
    if len(set(cells)) != len(cells):
        raise CaptionError(f"two objects share a position in {caption!r}")
    return Scene(tuple(objs), bg, bgc, 0)
