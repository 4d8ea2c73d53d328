"""The ``FIT`` rule (``sandbox.FIT``): every least-squares fit the library has is out of reach
while exercise 00's ``test_fit_alpha_beta`` runs, under every name it can be imported by. Each
bypass below is a right fit outside the grader (checked here first, so that the test could
fail), and earns nothing inside it, with a refusal that names the function and says to write
the fit."""

from __future__ import annotations

import pathlib

import nbformat
import pytest

from minidist.grading.notebook_grader import grade_notebook

ROOT = pathlib.Path(__file__).resolve().parents[2]
EX = "00_getting_started"
TEST = "test_fit_alpha_beta"
WHY = "is not allowed in this exercise: write the least-squares fit yourself"

BYPASSES = {  # the library function a fit_alpha_beta reaches: its body
    "minidist.bench.p2p.fit_alpha_beta":
        "    from minidist.bench.p2p import fit_alpha_beta as theirs\n"
        "    return theirs(sizes, seconds)\n",
    "minidist.bench.timing.fit_relative":
        "    from minidist.bench.timing import fit_relative\n"
        "    return fit_relative([(1, n) for n in sizes], seconds)\n",
    "minidist.bench.collectives.fit_path":  # one message of n bytes at p = 2
        "    from minidist.bench import collectives\n"
        "    return collectives.fit_path('recursive_doubling', 2, sizes, seconds)\n",
    "minidist.bench.collectives.fit_alpha_beta":  # bench.timing's, imported again
        "    import minidist.bench.collectives as c\n"
        "    return c.fit_alpha_beta(sizes, seconds)\n",
}
REFUSED_AS = {  # the name the refusal gives (one function object, several names)
    "minidist.bench.collectives.fit_alpha_beta": "minidist.bench.p2p.fit_alpha_beta",
}


def _source(body: str) -> str:
    return "def fit_alpha_beta(sizes, seconds):\n" + body


def _notebook(tmp_path, body: str) -> str:
    nb = nbformat.read(str(ROOT / "solutions" / f"{EX}.ipynb"), as_version=4)
    cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id")
             == "fit_alpha_beta"]
    assert len(cells) == 1
    cells[0].source = _source(body)
    path = tmp_path / f"{EX}.ipynb"
    nbformat.write(nb, str(path))
    return str(path)


@pytest.mark.parametrize("name", list(BYPASSES))
def test_a_fit_through_the_library_earns_nothing(name, tmp_path):
    ns: dict = {}
    exec(_source(BYPASSES[name]), ns)  # a right answer here, outside the grader
    alpha, beta = ns["fit_alpha_beta"]([8, 1024, 65536], [2e-6 + n / 1e9 for n in
                                                          (8, 1024, 65536)])
    assert alpha == pytest.approx(2e-6) and beta == pytest.approx(1e9)
    report = grade_notebook(_notebook(tmp_path, BYPASSES[name]), only=[TEST])
    (result,) = report.results
    assert result["grade_id"] == TEST and result["earned"] == 0, result
    assert f"{REFUSED_AS.get(name, name)} {WHY}" in result["feedback"], result["feedback"]
