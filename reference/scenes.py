"""The "scenes" reference domain: a procedural renderer of captioned scenes, 64x64 (v1, v2) or 128x128 (v3).

Each scene holds 1-3 objects (shape, colour, size, fill) in distinct cells of a 3x3 grid, jittered inside
the cell, over a named background. Rendering is deterministic from the scene (which carries its own
texture seed), and `sample_scene(rng)` is deterministic from the generator.

The domain is built to behave like natural images for speculative decoding: anti-aliased edges (coverage
from a signed distance), soft shading, backgrounds from smooth (flat, gradient) to detailed and spatially
correlated (clouds, waves, wood grain, stripes, checker, at random orientations), plus fine i.i.d. noise.
That makes many tokens both uncertain and dependent on their neighbours in both directions.

Geometry lives in units of a 64-pixel canvas (`SIZE`): sizes, jitter, periods and textures are the same
scene at any resolution. A render at `size` pixels samples that canvas at its own pixel centres; only what is
a property of the pixel grid stays in pixels: the one-pixel anti-aliased edge and the i.i.d. noise per pixel.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

SIZE = 64  # the canvas's side: every geometric constant below is in these units
RESOLUTIONS = (64, 128)  # pixels per side a render may have (v3 draws at 128: a 32x32 token grid)
GRID = 3  # objects live in a 3x3 grid of cells

SHAPES = ("circle", "square", "triangle", "diamond")
COLOURS = {
    "red": (0.88, 0.14, 0.14),
    "orange": (0.98, 0.55, 0.08),
    "yellow": (0.96, 0.88, 0.12),
    "green": (0.16, 0.72, 0.22),
    "blue": (0.14, 0.32, 0.94),
    "purple": (0.58, 0.20, 0.80),
}
SIZES = {"small": 5.0, "large": 8.5}  # "radius" in canvas units
FILLS = ("plain", "striped", "dotted", "shaded")
POSITIONS = (
    "top left", "top middle", "top right",
    "middle left", "center", "middle right",
    "bottom left", "bottom middle", "bottom right",
)  # index = row * 3 + col
BACKGROUNDS = ("flat", "gradient", "cloudy", "wavy", "wooden", "striped", "checkered")
SMOOTH_BACKGROUNDS = ("flat", "gradient")
BACKGROUND_WEIGHTS = (0.2, 0.2, 0.15, 0.12, 0.1, 0.13, 0.1)  # 60% detailed
BG_COLOURS = {
    "gray": (0.50, 0.50, 0.50),
    "beige": (0.80, 0.74, 0.60),
    "slate": (0.26, 0.31, 0.38),
    "brown": (0.45, 0.33, 0.22),
}
JITTER = 2.5  # max offset of an object's centre inside its cell, canvas units
NOISE_STD = 0.015  # fine i.i.d. pixel noise


@dataclass(frozen=True)
class SceneObject:
    shape: str
    colour: str
    size: str
    fill: str
    cell: int  # 0..8, row-major
    dx: float = 0.0  # jitter, pixels
    dy: float = 0.0

    @property
    def phrase(self) -> str:
        fill = "" if self.fill == "plain" else f"{self.fill} "
        return f"a {self.size} {fill}{self.colour} {self.shape} at the {POSITIONS[self.cell]}"


@dataclass(frozen=True)
class Scene:
    objects: tuple[SceneObject, ...]
    background: str
    bg_colour: str
    texture_seed: int = 0  # drives orientation, frequency and noise of the background

    @property
    def caption(self) -> str:
        phrases = [o.phrase for o in self.objects]
        body = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
        return f"{body} on a {self.background} {self.bg_colour} background"

    @property
    def spec(self) -> "Scene":
        """The scene without its jitter and texture: what a caption determines."""
        objs = tuple(SceneObject(o.shape, o.colour, o.size, o.fill, o.cell) for o in self.objects)
        return Scene(objs, self.background, self.bg_colour, 0)


def sample_scene(rng: np.random.Generator, n_objects: int | None = None) -> Scene:
    """Draw a random scene; objects occupy distinct cells, listed in raster order of their cells."""
    n = int(rng.integers(1, 4)) if n_objects is None else n_objects
    cells = sorted(rng.choice(GRID * GRID, size=n, replace=False).tolist())
    objs = []
    for cell in cells:
        objs.append(SceneObject(
            shape=SHAPES[rng.integers(len(SHAPES))],
            colour=list(COLOURS)[rng.integers(len(COLOURS))],
            size=list(SIZES)[rng.integers(len(SIZES))],
            fill=FILLS[rng.integers(len(FILLS))],
            cell=int(cell),
            dx=float(rng.uniform(-JITTER, JITTER)),
            dy=float(rng.uniform(-JITTER, JITTER)),
        ))
    bg = BACKGROUNDS[rng.choice(len(BACKGROUNDS), p=BACKGROUND_WEIGHTS)]
    bgc = list(BG_COLOURS)[rng.integers(len(BG_COLOURS))]
    return Scene(tuple(objs), bg, bgc, int(rng.integers(2**31)))


# --------------------------------------------------------------------------- geometry

@functools.lru_cache(maxsize=4)
def _pixel_centres(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(yy, xx) [size, size]: the pixel centres of a size-pixel render, in canvas units."""
    if size not in RESOLUTIONS:
        raise ValueError(f"render size must be one of {RESOLUTIONS}, got {size}")
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    return yy * (SIZE / size), xx * (SIZE / size)


def cell_centre(cell: int) -> tuple[float, float]:
    """(x, y) of a grid cell's centre, pixels."""
    step = SIZE / GRID
    return (cell % GRID + 0.5) * step, (cell // GRID + 0.5) * step


def _sdf(shape: str, x: np.ndarray, y: np.ndarray, r: float) -> np.ndarray:
    """Signed distance (pixels, negative inside) of a shape of 'radius' r centred at the origin."""
    if shape == "circle":
        return np.sqrt(x * x + y * y) - r
    if shape == "square":
        s = r * 0.88  # equal visual area-ish to the circle
        qx, qy = np.abs(x) - s, np.abs(y) - s
        outside = np.sqrt(np.maximum(qx, 0) ** 2 + np.maximum(qy, 0) ** 2)
        return outside + np.minimum(np.maximum(qx, qy), 0)
    if shape == "diamond":
        return (np.abs(x) + np.abs(y) - r * 1.2) / math.sqrt(2)
    if shape == "triangle":  # upright equilateral triangle, exact 2D SDF
        rr = r * 1.1
        k = math.sqrt(3.0)
        px, py = np.abs(x), -(y - rr * 0.2)  # flip y: image rows grow downwards
        px, py = px - rr, py + rr / k
        m = px + k * py > 0
        px, py = np.where(m, (px - k * py) / 2, px), np.where(m, (-k * px - py) / 2, py)
        px = px - np.clip(px, -2 * rr, 0)
        return -np.sqrt(px * px + py * py) * np.sign(py)
    raise ValueError(f"unknown shape {shape!r}")


def _value_noise(rng: np.random.Generator, cells: int, size: int) -> np.ndarray:
    """Smooth noise in [0, 1]: a random cells x cells lattice, bicubically-smooth interpolated to size x size."""
    lat = rng.random((cells + 3, cells + 3)).astype(np.float32)
    t = (np.arange(size, dtype=np.float32) + 0.5) / size * cells + 1.0
    i = np.floor(t).astype(int)
    f = t - i
    f = f * f * (3 - 2 * f)  # smoothstep
    rows = lat[i] * (1 - f)[:, None] + lat[i + 1] * f[:, None]  # [size, cells+3]
    return rows[:, i] * (1 - f)[None, :] + rows[:, i + 1] * f[None, :]


def _clouds(rng: np.random.Generator, size: int) -> np.ndarray:
    out = 0.55 * _value_noise(rng, 3, size) + 0.3 * _value_noise(rng, 6, size) + 0.15 * _value_noise(rng, 12, size)
    return (out - out.mean()) / (out.std() + 1e-6)


def _background(scene: Scene, rng: np.random.Generator, size: int) -> np.ndarray:
    """[size, size, 3] float background."""
    yy, xx = _pixel_centres(size)
    base = np.array(BG_COLOURS[scene.bg_colour], np.float32)
    theta = rng.uniform(0, math.pi)
    u = xx * math.cos(theta) + yy * math.sin(theta)  # coordinate along a random direction
    kind = scene.background
    if kind == "flat":
        t = np.zeros_like(xx)
    elif kind == "gradient":
        t = (u - u.mean()) / SIZE * 2.2
    elif kind == "cloudy":
        t = _clouds(rng, size) * 0.55
    elif kind == "wavy":
        period = rng.uniform(9, 16)
        warp = _value_noise(rng, 3, size) * rng.uniform(3, 6)
        t = 0.8 * np.sin(2 * math.pi * (u + warp) / period)
    elif kind == "wooden":
        cx, cy = rng.uniform(-80, 140, size=2)
        dist = np.sqrt((xx - cx) ** 2 + (yy - cy) ** 2) + _value_noise(rng, 4, size) * 6
        ring = np.sin(2 * math.pi * dist / rng.uniform(4.5, 7.0))
        t = 0.7 * np.sign(ring) * np.abs(ring) ** 0.5 + 0.3 * (_value_noise(rng, 8, size) - 0.5)
    elif kind == "striped":
        theta = rng.choice([0.0, math.pi / 4, math.pi / 2, 3 * math.pi / 4])
        u = xx * math.cos(theta) + yy * math.sin(theta)
        period = rng.uniform(6, 11)
        t = np.clip(np.sin(2 * math.pi * u / period + rng.uniform(0, 6.3)) * 3, -1, 1) * 0.75
    elif kind == "checkered":
        sq = rng.uniform(6, 11)
        ox, oy = rng.uniform(0, sq, size=2)
        cx = np.sin(math.pi * (xx + ox) / sq)
        cy = np.sin(math.pi * (yy + oy) / sq)
        t = np.clip(cx * cy * 4, -1, 1) * 0.75
    else:
        raise ValueError(f"unknown background {kind!r}")
    amp = 0.16
    tint = np.array([1.0, 0.97, 0.9], np.float32) if kind == "wooden" else np.ones(3, np.float32)
    return base[None, None, :] * tint + amp * t[..., None]


def _fill(obj: SceneObject, x: np.ndarray, y: np.ndarray, r: float, rng: np.random.Generator) -> np.ndarray:
    """[size, size, 3] colour field of an object (before coverage masking), canvas coordinates relative to its
    centre."""
    col = np.array(COLOURS[obj.colour], np.float32)
    # soft shading on every object: light from the top left
    light = 1.0 - 0.10 * np.clip((x + y) / (2 * r), -1, 1)
    if obj.fill == "shaded":
        light = 1.0 - 0.38 * np.clip((x + y) / (1.6 * r), -1, 1)
        out = col[None, None, :] * light[..., None]
    elif obj.fill == "striped":
        phase = rng.uniform(0, 6.3)
        s = np.clip(np.sin(2 * math.pi * (x - y) / 4.5 + phase) * 3, -1, 1)  # diagonal stripes, ~4.5 px
        out = col[None, None, :] * (0.72 + 0.28 * s)[..., None] * light[..., None]
    elif obj.fill == "dotted":
        ox, oy = rng.uniform(0, 4, size=2)
        d = np.sqrt(((x + ox) % 4.0 - 2.0) ** 2 + ((y + oy) % 4.0 - 2.0) ** 2)
        dot = np.clip(1.2 - d, 0, 1)  # anti-aliased dots of radius ~1.2 px
        out = (col[None, None, :] * (1 - dot[..., None]) + 0.97 * dot[..., None]) * light[..., None]
    elif obj.fill == "plain":
        out = col[None, None, :] * light[..., None]
    else:
        raise ValueError(f"unknown fill {obj.fill!r}")
    return out


def render(scene: Scene, with_mask: bool = False, size: int = SIZE) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Render a scene to a [size, size, 3] uint8 image, deterministically from the scene and size.

    with_mask also returns the objects' coverage [size, size] uint8 (0..255), for foreground-weighted losses."""
    rng = np.random.default_rng(scene.texture_seed)
    img = _background(scene, rng, size)
    yy, xx = _pixel_centres(size)
    px = size / SIZE  # pixels per canvas unit: the anti-aliased edge is one pixel wide at any size
    mask = np.zeros((size, size), np.float32)
    for obj in scene.objects:
        cx, cy = cell_centre(obj.cell)
        x, y = xx - (cx + obj.dx), yy - (cy + obj.dy)
        r = SIZES[obj.size]
        d = _sdf(obj.shape, x, y, r)
        cover = np.clip(0.5 - d * px, 0.0, 1.0)[..., None]  # anti-aliased coverage
        # a faint soft shadow below-right gives depth and smooth, context-dependent tokens
        sd = _sdf(obj.shape, x - 1.2, y - 1.5, r)
        shadow = np.clip(0.5 - sd / 2.0, 0.0, 1.0)[..., None] * 0.25
        img = img * (1 - shadow)
        img = img * (1 - cover) + _fill(obj, x, y, r, rng) * cover
        mask = np.maximum(mask, np.clip(1.5 - d / 1.5, 0.0, 1.0))  # coverage plus a rim around the edge
    img = img + rng.normal(0, NOISE_STD, img.shape).astype(np.float32)
    out = (np.clip(img, 0, 1) * 255 + 0.5).astype(np.uint8)
    return (out, (mask * 255 + 0.5).astype(np.uint8)) if with_mask else out
