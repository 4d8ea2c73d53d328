"""The authoritative tests, one module per graded notebook (see ``registry.EXERCISES``)."""
