"""docs/api.md lists every public name with its signature and meaning, and is current
(issue 25, item 8): regenerate it with ``python -m minidist.apidoc > docs/api.md``."""

from __future__ import annotations

import pathlib

import minidist as md
from minidist import apidoc

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_api_page_is_current():
    assert PAGE.read_text() == apidoc.render(), (
        "docs/api.md is out of date: run python -m minidist.apidoc > docs/api.md")


def test_every_public_name_has_a_row_with_a_meaning():
    text = PAGE.read_text()
    for name in md.__all__:
        rows = [line for line in text.splitlines() if line.startswith(f"| `md.{name}")]
        assert rows, f"md.{name} is missing from docs/api.md"
        cells = rows[0].split(" | ")
        assert cells[-1].strip(" |"), f"md.{name} has no meaning: give it a docstring"
    for sub in apidoc.SUBPACKAGES:
        for name in apidoc.public_names(getattr(md, sub)):
            assert f"| `md.{sub}.{name}" in text, f"md.{sub}.{name} is missing"


def test_names_a_user_meets_are_importable_from_md():
    for name in ("HybridGPT", "MixedPrecision", "ScheduleNaive", "ScheduleInterleaved1F1B"):
        assert name in md.__all__ and getattr(md, name) is not None


def test_signatures_are_stable_text():
    assert " object at 0x" not in apidoc.render()
