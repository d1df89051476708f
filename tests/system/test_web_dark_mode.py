"""The console follows the system's colour scheme: headless Chromium told the user prefers
dark (CDP Emulation.setEmulatedMedia) draws the pages on a dark ground with light text, and
the light scheme stays as it was; a screenshot of each (FAIRQ_WEB_SCREENSHOTS=docs/web keeps
them)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.system.test_web_browser import _missing, browser, console, shot, until

pytestmark = pytest.mark.skipif(_missing() is not None,
                                reason=f"chromium and chromedriver are needed: {_missing()}")
__all__ = ["browser", "console"]  # the fixtures, used by name


def luminance(css: str) -> float:
    """Relative luminance (0 black .. 1 white) of an ``rgb(...)``/``rgba(...)`` value."""
    parts = [float(x) for x in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
    lin = [(c / 255) / 12.92 if c / 255 <= 0.03928 else ((c / 255 + 0.055) / 1.055) ** 2.4
           for c in parts]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def colours(d: Any) -> dict[str, float]:
    from selenium.webdriver.common.by import By

    body = d.find_element(By.TAG_NAME, "body")
    card = d.find_element(By.CSS_SELECTOR, "table.grid")
    return {"ground": luminance(body.value_of_css_property("background-color")),
            "text": luminance(body.value_of_css_property("color")),
            "card": luminance(card.value_of_css_property("background-color"))}


def test_dark_mode_follows_the_system(console: str, browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    d = browser
    d.get(console + "/tenants")
    until(d, lambda: d.find_elements(By.CSS_SELECTOR, "table.grid td .reason"), "a tenant row",
          reload=True)
    light = colours(d)
    assert light["ground"] > 0.8 and light["text"] < 0.1, light
    shot(d, tmp_path, "tenants-light.png")
    d.execute_cdp_cmd("Emulation.setEmulatedMedia", {
        "features": [{"name": "prefers-color-scheme", "value": "dark"}]})
    d.get(console + "/tenants")
    until(d, lambda: d.find_elements(By.CSS_SELECTOR, "table.grid td .reason"), "a tenant row",
          reload=True)
    dark = colours(d)
    assert dark["ground"] < 0.05 and dark["card"] < 0.05 and dark["text"] > 0.6, dark
    # Contrast of text on its ground: WCAG's ratio, at least 7 (AAA) as in the light scheme.
    assert (dark["text"] + 0.05) / (dark["ground"] + 0.05) > 7
    shot(d, tmp_path, "tenants-dark.png")
    d.get(console + "/")
    assert colours_of_page(d) < 0.05
    shot(d, tmp_path, "overview-dark.png")


def colours_of_page(d: Any) -> float:
    from selenium.webdriver.common.by import By

    return luminance(d.find_element(By.TAG_NAME, "body").value_of_css_property(
        "background-color"))
