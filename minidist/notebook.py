"""Helpers for the lessons, so that a saved notebook reads as well as a running one.

* ``quick_mode()``: True under CI or ``MINIDIST_QUICK=1``; lessons and benches shrink their
  sweeps then.

* ``progress(items, desc)``: tqdm's notebook bar while a long loop runs, replaced by one line
  ("ping-pong sizes: 9 of 9 in 26 s") when it ends, so a saved notebook holds neither a
  dead widget nor stderr text; no bar in quick mode (CI) and none in a plain script.
* ``interact(fn, **controls)``: ``ipywidgets.interactive(fn, **controls)`` displayed with a
  static fallback: the figure ``fn`` draws for the controls' initial values (PNG) and a line
  saying that running the cell brings the controls. JupyterLab with a kernel shows the live
  widget; an untrusted notebook (a fresh clone) and a code host's viewer show the picture.

``fn`` draws with matplotlib and ends with ``plt.show()``, as ``ipywidgets.interact`` expects.

* ``machine(ranks)``: this machine's cores and the CPU that *other* work takes now, for the
  cells that read a measurement against a prediction. Not the load average: that counts
  the lesson's own ranks for a minute after they end, so a quiet 2-core machine that just
  ran 4 ranks reads as busy.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import time
from dataclasses import dataclass

LIVE_NOTE = "(a live widget: run this cell in Jupyter to get the controls)"


def quick_mode() -> bool:
    """CI (``CI=true``) and ``MINIDIST_QUICK=1`` shrink sweeps to a few seconds: the lessons,
    the exercises and the benches (``--quick``) all ask here."""
    return os.environ.get("MINIDIST_QUICK", "") not in ("", "0") or \
        os.environ.get("CI", "").lower() in ("1", "true")


@dataclass(frozen=True)
class Machine:
    """``cores`` this process may run on, ``other``: cores' worth of CPU that other processes
    used while this one slept, ``ranks``: how many ranks the measurement ran."""

    cores: int
    other: float
    ranks: int

    @property
    def busy(self) -> bool:
        """Other work takes cores the ranks need: at least half a core of it, and fewer free
        cores than ranks (a many-core laptop with a browser open is not busy for 4 ranks)."""
        return self.other >= 0.5 and self.cores - self.other < self.ranks

    def __str__(self) -> str:
        return (f"{self.cores} cores for {self.ranks} rank{'s' if self.ranks > 1 else ''}, "
                f"other work using {self.other:.1f} of them")


def machine(ranks: int, seconds: float = 0.5) -> Machine:
    """Sample what other processes run over ``seconds`` (see ``Machine``)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return Machine(cores, round(other_work(seconds), 2), ranks)


def other_work(seconds: float) -> float:
    """Cores' worth of CPU used by every process but this one, over ``seconds`` of sleep:
    the busy share of ``/proc/stat``'s CPU time (Linux), else ``psutil``, else the load
    average (which also counts ranks that ended less than a minute ago)."""
    def stat() -> tuple[float, float, float]:
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, *rest = map(int, f.readline().split()[1:9])
        own = sum(os.times()[:2])  # this process's user + system seconds
        return user + nice + system + sum(rest), idle + iowait, own

    try:
        (b0, i0, own0), _, (b1, i1, own1) = stat(), time.sleep(seconds), stat()
    except (OSError, ValueError):
        try:
            import psutil
        except ImportError:
            return max(0.0, os.getloadavg()[0] - 1)  # one: this process's own work
        return psutil.cpu_percent(interval=seconds) / 100 * (os.cpu_count() or 1)
    busy, total = b1 - b0, (b1 - b0) + (i1 - i0)
    everyone = busy / total * (os.cpu_count() or 1) if total > 0 else 0.0
    return max(0.0, everyone - (own1 - own0) / seconds)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (where widgets and display ids work)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def progress(items, desc: str, total: int | None = None):
    """Iterate over ``items`` with a progress bar that leaves one line of text behind."""
    if quick_mode() or not in_notebook():
        yield from items
        return
    from IPython.display import display
    from tqdm.notebook import tqdm

    total = len(items) if total is None and hasattr(items, "__len__") else total
    bar = tqdm(items, desc=desc, total=total, display=False)
    handle = display(bar.container, display_id=True)
    start = time.perf_counter()
    try:
        yield from bar
    finally:
        bar.close()
        for widget in (*bar.container.children, bar.container):
            widget.close()  # nothing of the bar stays in the saved widget state
        done = f"{bar.n} of {total}" if total is not None else f"{bar.n}"
        handle.update({"text/plain": f"{desc}: {done} in {time.perf_counter() - start:.0f} s"},
                      raw=True)


def interact(fn, note: str = LIVE_NOTE, **controls):
    """Show ``ipywidgets.interactive(fn, **controls)`` with a static fallback (see the module
    docstring); returns the ``interactive`` widget."""
    import ipywidgets
    from IPython.display import display

    live = ipywidgets.interactive(fn, **controls)  # calls fn once, into its own output
    png, printed = snapshot(fn, dict(live.kwargs))
    display(WithFallback(live, png, (printed.rstrip() + "\n" + note).strip()))
    return live


def snapshot(fn, kwargs: dict) -> tuple[bytes | None, str]:
    """Call ``fn(**kwargs)`` and return (PNG of the last figure it drew or None, what it
    printed), showing nothing: ``plt.show`` is a no-op meanwhile and its figures are closed."""
    import matplotlib.pyplot as plt

    before, out, show = set(plt.get_fignums()), io.StringIO(), plt.show
    plt.show = lambda *args, **kwargs: None
    try:
        with contextlib.redirect_stdout(out):
            fn(**kwargs)
    finally:
        plt.show = show
    new = [n for n in plt.get_fignums() if n not in before]
    png = None
    if new:
        buf = io.BytesIO()
        plt.figure(new[-1]).savefig(buf, format="png", bbox_inches="tight")
        png = buf.getvalue()
    for n in new:
        plt.close(n)
    return png, out.getvalue()


class WithFallback:
    """A widget's display bundle plus a PNG and a text: frontends that render widgets pick
    the widget; the others (untrusted notebooks, code hosts) pick the picture or the text."""

    def __init__(self, widget, png: bytes | None, text: str):
        self.widget, self.png, self.text = widget, png, text

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = dict(self.widget._repr_mimebundle_())
        data["text/plain"] = self.text
        if self.png is not None:
            data["image/png"] = base64.b64encode(self.png).decode("ascii")
        return data
