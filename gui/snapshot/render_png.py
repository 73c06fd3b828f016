"""Render an HTML page (a snapshot's report.html) to a PNG with headless Chromium.

For looking at a report without a browser window (CI artefacts, tickets, docs):

    python -m gui.snapshot.render_png BUNDLE.zip OUT.png

Chromium cannot size a screenshot to the page, so the page is shot in a tall window and
the empty band below it is trimmed off (with Pillow). Pure Python (no Qt).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_browser() -> str:
    """The path of the first Chromium-like browser on PATH; RuntimeError naming what was looked for."""
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    raise RuntimeError(f"no headless browser found: looked for {', '.join(BROWSERS)} on PATH "
                       "(on Debian: apt-get install chromium)")


def render_html_to_png(html_path, png_path, width: int = 1280, height: int = 6000, *, trim: bool = True,
                       max_height: int = 24000, browser: str | None = None, timeout_s: float = 90.0) -> Path:
    """Screenshot `html_path` at `width` x `height` CSS pixels into `png_path`. With `trim`,
    the uniform band below the page's content is cut off, and a page taller than `height`
    is shot again in a window twice as tall (up to `max_height`). Returns the PNG's path."""
    html_path, png_path = Path(html_path).resolve(), Path(png_path).resolve()
    if not html_path.is_file():
        raise FileNotFoundError(html_path)
    browser = browser or find_browser()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        _shoot(browser, html_path, png_path, width, height, timeout_s)
        if not trim or _trim_bottom(png_path) or height >= max_height:
            return png_path
        height = min(2 * height, max_height)


def _shoot(browser: str, html_path: Path, png_path: Path, width: int, height: int, timeout_s: float) -> None:
    png_path.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="pagewarden-chromium-") as profile:
        command = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--hide-scrollbars", "--no-first-run", "--force-device-scale-factor=1",
                   f"--user-data-dir={profile}", f"--window-size={width},{height}",
                   f"--screenshot={png_path}", html_path.as_uri()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not png_path.is_file():
        raise RuntimeError(f"{browser} did not render {html_path} (exit {done.returncode}): "
                           f"{done.stderr.strip()[-800:]}")


def _trim_bottom(png_path: Path, margin: int = 24) -> bool:
    """Crop the rows at the bottom that are all the colour of the bottom-left pixel; False
    when there is no such band (the page may go on below the window)."""
    from PIL import Image, ImageChops

    with Image.open(png_path) as image:
        image = image.convert("RGB")
    background = Image.new("RGB", image.size, image.getpixel((0, image.height - 1)))
    box = ImageChops.difference(image, background).getbbox()
    if box is None:
        return True  # a blank page: nothing below it
    if box[3] + margin < image.height:
        image.crop((0, 0, image.width, box[3] + margin)).save(png_path)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m gui.snapshot.render_png BUNDLE.zip OUT.png", file=sys.stderr)
        return 2
    from gui.snapshot.bundle_limits import MAX_MEMBER_BYTES

    bundle, out = args
    with zipfile.ZipFile(bundle) as archive, tempfile.TemporaryDirectory(prefix="pagewarden-report-") as tmp:
        names = [n for n in archive.namelist() if n == "report.html" or n.endswith("/report.html")]
        if not names:
            print(f"{bundle} has no report.html", file=sys.stderr)
            return 1
        info = archive.getinfo(min(names, key=len))
        if info.file_size > MAX_MEMBER_BYTES:  # a zip bomb: the declared size bounds what zipfile inflates
            print(f"{bundle}: {info.filename} claims {info.file_size:,} bytes (limit {MAX_MEMBER_BYTES:,})",
                  file=sys.stderr)
            return 1
        html = Path(tmp) / "report.html"
        html.write_bytes(archive.read(info))
        print(render_html_to_png(html, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
