"""The package metadata: pyproject and environment.yml name the same dependencies."""

from __future__ import annotations

import pathlib
import re

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    wanted |= {_name(r) for r in project["optional-dependencies"]["dev"]}
    deps = (ROOT / "environment.yml").read_text().split("dependencies:", 1)[1]
    items = re.findall(r"^\s*-\s+(\S.*)$", deps, re.M)
    listed = {_name(i) for i in items if not i.startswith(("-e", "pip"))} - {"python"}
    # conda calls torch "pytorch"
    listed = {"torch" if n == "pytorch" else n for n in listed}
    assert wanted == listed, f"only in pyproject: {wanted - listed}; only in env: {listed - wanted}"


def test_console_script_and_layout():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["minidist"] == "minidist.cli:main"
    for d in ("minidist", "lessons", "exercises", "solutions", "tests"):
        assert (ROOT / d).is_dir(), d
