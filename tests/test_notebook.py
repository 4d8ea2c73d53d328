"""minidist.notebook: the lessons' progress bars and widgets with a static fallback."""

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
