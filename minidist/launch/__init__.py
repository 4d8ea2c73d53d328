"""Layer 2: starting ranks. ``md.launch`` (``processes.py``) from a notebook or script,
``md.init`` (``runtime.py``) inside a script that ``minidist run`` (``script_runner.py``) or
``torchrun`` started."""

from .processes import RankFailed, Results, launch
from .runtime import init

__all__ = ["RankFailed", "Results", "launch", "init"]
