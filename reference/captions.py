"""Word-level caption tokenizer and caption parser for the scenes domain.

The vocabulary is closed: it is exactly the words the caption grammar uses, plus <pad> and <null> (the
unconditional caption for classifier-free guidance). Unknown words are an error that names them: a
text-to-image model that silently drops "magenta" would draw something the user did not ask for.
"""

from __future__ import annotations

import re

from ssdgen.decoders.protocol import EMPTY, GRAMMAR, NO_KNOWN_WORDS, TOO_LONG, UNKNOWN_WORDS, PromptError

from .scenes import BACKGROUNDS, BG_COLOURS, COLOURS, FILLS, POSITIONS, SHAPES, SIZES, Scene, SceneObject

MAX_CAPTION_TOKENS = 36
PAD, NULL = "<pad>", "<null>"


class CaptionError(PromptError):
    """A caption that cannot be encoded or parsed; the message says what is wrong, `reason` which rule it broke
    (decoders/protocol.py's codes)."""


def _grammar_words() -> list[str]:
    words = {"a", "at", "the", "and", ",", "on", "background"}
    for group in (SHAPES, COLOURS, SIZES, FILLS, BACKGROUNDS, BG_COLOURS):
        words.update(group)
    for p in POSITIONS:
        words.update(p.split())
    return sorted(words)


VOCAB: list[str] = [PAD, NULL] + _grammar_words()
_INDEX = {w: i for i, w in enumerate(VOCAB)}
# any script's letters and digits make words (so "赤い" or "42" is named as unknown, not silently dropped);
# other punctuation and symbols (emoji) are ignored
_SPLIT = re.compile(r"[^\W_]+|,")


def words(caption: str) -> list[str]:
    """Lower-case words and commas; other punctuation is ignored."""
    return _SPLIT.findall(caption.lower())


# the vocabulary as an error lists it: its words, sorted, comma-separated; not the comma token, which listed as ","
# read as a stray separator at the head of the list
KNOWN = ", ".join(w for w in VOCAB[2:] if w.isalnum())


def _named(unknown: list[str], most: int = 10) -> str:
    """The first unknown words, so a long foreign-language prompt gives a short message."""
    more = f" and {len(unknown) - most} more" if len(unknown) > most else ""
    return f"{unknown[:most]}{more}"


def encode(caption: str) -> list[int]:
    """Caption -> MAX_CAPTION_TOKENS ids, right-padded with <pad>."""
    if not isinstance(caption, str) or not caption.strip():
        raise CaptionError("empty caption: describe at least one object and the background, e.g. 'a large red "
                           "circle at the center on a flat gray background'", EMPTY)
    ws = words(caption)
    unknown = sorted({w for w in ws if w not in _INDEX})
    if not any(w in _INDEX and w != "," for w in ws):  # the model would draw from an empty caption
        named = f" (unknown words {_named(unknown)})" if unknown else ""
        raise CaptionError(f"none of the reference model's words{named}; it knows only: {KNOWN}", NO_KNOWN_WORDS)
    if unknown:
        raise CaptionError(f"unknown words {_named(unknown)}; the reference model knows only: {KNOWN}", UNKNOWN_WORDS)
    if len(ws) > MAX_CAPTION_TOKENS:
        raise CaptionError(f"caption has {len(ws)} tokens; the reference model takes at most {MAX_CAPTION_TOKENS}",
                           TOO_LONG)
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
        raise CaptionError(f"caption does not end in 'on a <kind> <colour> background': {caption!r}", GRAMMAR)
    body, bg, bgc = m.groups()
    parts = re.split(r", | and ", body)
    objs = []
    for part in parts:
        om = _OBJ.match(part)
        if not om:
            raise CaptionError(f"cannot parse object phrase {part!r} in {caption!r}", GRAMMAR)
        size, fill, colour, shape, pos = om.groups()
        objs.append(SceneObject(shape, colour, size, fill or "plain", POSITIONS.index(pos)))
    cells = [o.cell for o in objs]
    if len(set(cells)) != len(cells):
        raise CaptionError(f"two objects share a position in {caption!r}", GRAMMAR)
    return Scene(tuple(objs), bg, bgc, 0)
