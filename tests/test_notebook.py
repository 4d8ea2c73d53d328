"""minidist.notebook: the lessons' progress bars and widgets with a static fallback."""

import time

import matplotlib

matplotlib.use("Agg")

import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

from minidist import notebook  # noqa: E402


def draw(a):
    print(f"a = {a}")
    fig, ax = plt.subplots(figsize=(2, 2))
    ax.plot([0, a])
    plt.show()


def test_snapshot_returns_the_figure_and_the_text_and_leaves_no_figure_open():
    before = plt.get_fignums()
    png, printed = notebook.snapshot(draw, {"a": 3})
    assert png.startswith(b"\x89PNG")
    assert printed == "a = 3\n"
    assert plt.get_fignums() == before


def test_the_display_bundle_offers_widget_picture_and_text():
    live = ipywidgets.interactive(draw, a=ipywidgets.IntSlider(value=2))
    png, printed = notebook.snapshot(draw, dict(live.kwargs))
    data = notebook.WithFallback(live, png, printed + notebook.LIVE_NOTE)._repr_mimebundle_()
    assert set(data) == {"application/vnd.jupyter.widget-view+json", "image/png", "text/plain"}
    assert "run this cell" in data["text/plain"] and data["text/plain"].startswith("a = 2")


def test_progress_outside_a_notebook_yields_every_item_in_order():
    assert list(notebook.progress(range(5), desc="x")) == [0, 1, 2, 3, 4]


def test_the_machine_is_busy_only_when_other_work_takes_cores_the_ranks_need():
    assert notebook.Machine(cores=2, other=2.0, ranks=2).busy
    assert notebook.Machine(cores=2, other=0.6, ranks=2).busy
    assert not notebook.Machine(cores=2, other=0.3, ranks=4).busy  # only its own ranks: quiet
    assert not notebook.Machine(cores=16, other=1.5, ranks=4).busy  # cores to spare
    assert str(notebook.Machine(2, 0.04, 4)) == "2 cores for 4 ranks, other work using 0.0 of them"


def test_other_work_sees_a_busy_process_and_not_this_one():
    """The reading the lessons print beside a measurement: a busy-looping process is other
    work; this process's own thread is not (the load average counts both, and the lesson's
    ranks for a minute after they end)."""
    import subprocess
    import sys
    import threading

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        with_hog = notebook.other_work(1.0)
    finally:
        hog.kill()
        hog.wait()
    stop = threading.Event()
    spinner = threading.Thread(target=lambda: [None for _ in iter(stop.is_set, True)])
    spinner.start()
    try:
        with_spinner = notebook.other_work(1.0)
    finally:
        stop.set()
        spinner.join()
    assert with_hog >= 0.5, with_hog  # a busy loop gets at least half a core of two
    assert with_spinner < with_hog - 0.3, (with_spinner, with_hog)
