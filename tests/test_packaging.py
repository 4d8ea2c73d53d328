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


def test_environment_yml_takes_torch_from_conda_forge():
    text = (ROOT / "environment.yml").read_text()
    channels = text.split("channels:", 1)[1].split("dependencies:", 1)[0]
    assert re.findall(r"^\s*-\s+(\S+)", channels, re.M) == ["conda-forge"]


def test_python_m_minidist_is_the_command():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "minidist", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "run" in out.stdout and "bench" in out.stdout and "grade" in out.stdout


def test_no_two_modules_share_a_file_name():
    """Two files called runner.py doing different jobs make a reader guess; names say what a
    file holds (``__init__.py`` aside). A benchmark (``bench/ddp.py``) is named after its
    subject; an exercise's grading files (``grading/exercises/ex01_collectives/checks.py``)
    after the part they play in every exercise's folder."""
    named_after_subject = {ROOT / "minidist" / "bench"}
    exercises = ROOT / "minidist" / "grading" / "exercises"
    seen: dict[str, list[str]] = {}
    for p in (ROOT / "minidist").rglob("*.py"):
        if p.name != "__init__.py" and p.parent not in named_after_subject and \
                p.parent.parent != exercises:
            seen.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, twice
