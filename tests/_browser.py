"""The built site as a reader sees it, in a real browser: what is wider than its box.

`clipped` loads each page of a built site in headless Chromium (the system's package), 1280 px
wide, and lists, per page, each output block (what a program prints: a fenced block without
a language, or a notebook's output), table and notebook image that a reader cannot see whole:
wider than the box that scrolls it, or past the page's column.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

#: The system's Chromium, as Debian and Ubuntu name it (None: not installed).
CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None
)

#: Runs in a page beside the site's: loads each page in a 1280 px frame and measures it.
MEASURE = r"""
function clipped(el, column, view) {
  for (let box = el; box && box !== column; box = box.parentElement) {
    const overflow = view.getComputedStyle(box).overflowX;
    if (/(auto|scroll|hidden)/.test(overflow) && box.scrollWidth > box.clientWidth + 1) {
      return true;
    }
  }
  return el.getBoundingClientRect().right > column.getBoundingClientRect().right + 1;
}

async function measure(pages) {
  const found = {};
  for (const page of pages) {
    const frame = document.createElement("iframe");
    frame.style.width = "1280px";
    frame.style.height = "900px";
    document.body.appendChild(frame);
    await new Promise((done) => { frame.onload = done; frame.src = page; });
    await new Promise((done) => setTimeout(done, 300));
    const doc = frame.contentDocument, view = frame.contentWindow;
    const column = doc.querySelector(".md-content__inner") || doc.body;
    const wide = [];
    const kinds = {
      output: "div.language-text pre > code, .jp-OutputArea-output pre",
      table: ".md-content__inner table",
      image: ".jp-OutputArea-output img",
    };
    for (const [kind, selector] of Object.entries(kinds)) {
      for (const el of doc.querySelectorAll(selector)) {
        if (clipped(el, column, view)) {
          const text = (el.textContent || el.getAttribute("alt") || "").trim();
          wide.push(`${kind}: ${text.split("\n")[0].slice(0, 70)}`);
        }
      }
    }
    found[page] = wide;
    frame.remove();
  }
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
}
"""


def clipped(site: Path, pages: list[str]) -> dict[str, list[str]]:
    """What each of `pages` (paths under `site`) shows cut off at 1280 px.

    Args:
        site: a built site (``mkdocs build``).
        pages: its pages, e.g. ``resume/index.html``.

    Returns:
        Per page, a line per block, table or image a reader cannot see whole.
    """
    harness = site / "_clipped.html"
    harness.write_text(
        "<!doctype html><html><body><script>"
        f"{MEASURE}\nmeasure({json.dumps(pages)});</script></body></html>"
    )
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--allow-file-access-from-files"]
        + ["--virtual-time-budget=300000", "--window-size=1400,1000", "--dump-dom"]
        + [harness.as_uri()],
        capture_output=True,
        text=True,
        timeout=600,
    )
    harness.unlink()
    found = re.search(r'<pre id="measured">(.*?)</pre>', done.stdout, re.S)
    assert found, f"Chromium measured nothing (rc {done.returncode}): {done.stderr[-2000:]}"
    return json.loads(html.unescape(found[1]))
