"""The cost model: time and memory of a training plan, as formulas in code, for clusters far
larger than this machine. The lessons, ``auto`` and the tests use these same functions."""
