"""An HTML page rendered to PNG with headless Chromium: the docs' screenshots of the bench and report pages
(`python -m lab screenshot PAGE.html OUT.png`), and a check that a page renders (tests/test_bench.py)."""

from __future__ import annotations

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    import shutil
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(html_path, png_path, width: int = 1200, height: int = 1600, timeout: float = 120) -> str:
    """Render a local HTML file to PNG with headless Chromium (no network, throwaway profile). Returns the
    PNG path; raises FileNotFoundError when no Chromium is installed (`apt-get install -y chromium`)."""
    import subprocess
    import tempfile
    from pathlib import Path
    exe = find_chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (Debian: apt-get install -y chromium)")
    html_path, png_path = Path(html_path).resolve(), Path(png_path).resolve()
    with tempfile.TemporaryDirectory() as profile:
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
               f"--user-data-dir={profile}", f"--screenshot={png_path}", f"--window-size={width},{height}",
               html_path.as_uri()]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0 or not png_path.exists():
        raise RuntimeError(f"chromium failed ({r.returncode}): {r.stderr[-2000:]}")
    return str(png_path)
