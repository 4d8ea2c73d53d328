"""Running a notebook top to bottom in a fresh kernel: ``minidist grade --execute`` (notes
on cells that raise; never part of the score) and ``build --execute`` (refreshing outputs)."""

from __future__ import annotations

import os
import pathlib

import nbformat


def current_env_kernel():
    """A kernel manager that starts this Python (the one minidist is installed in), whatever
    kernel named "python3" the user's Jupyter setup may point at."""
    import ipykernel.kernelspec
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class _ThisPython(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return self.kernel_spec_class(resource_dir=ipykernel.kernelspec.RESOURCES,
                                          **ipykernel.kernelspec.get_kernel_dict())

    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=_ThisPython())


def run_for_notes(nb, tests, path, cell_timeout: float, quick: bool) -> list[str]:
    """Run the notebook's code cells (test cells too: they are the learner's to run) in a
    fresh kernel; one note per cell that raised, and one if the run had to stop."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    cells = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    run = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.source) for _, c in cells])
    client = NotebookClient(run, km=current_env_kernel(), timeout=cell_timeout,
                            allow_errors=True, interrupt_on_timeout=False,
                            shutdown_kernel="immediate", record_timing=False,
                            extra_arguments=["--IPKernelApp.log_level=ERROR"],
                            resources={"metadata": {"path": str(pathlib.Path(path).parent)}})
    env = dict(os.environ, MINIDIST_QUICK="1") if quick else dict(os.environ)
    notes = []
    try:
        with client.setup_kernel(env=env, cleanup_kc=True):
            for k, ((index, _), cell) in enumerate(zip(cells, run.cells)):
                try:
                    client.execute_cell(cell, k)
                except CellTimeoutError:
                    return notes + [f"running the notebook stopped: cell {index + 1} ran "
                                    f"longer than {cell_timeout:g} s"]
                except DeadKernelError:
                    return notes + [f"running the notebook stopped: the kernel died in cell "
                                    f"{index + 1}"]
                error = _error_of(cell)
                if error:
                    notes.append(f"cell {index + 1} raised {error}")
    except Exception as e:  # the kernel failed to start or to shut down
        notes.append(f"running the notebook failed: {type(e).__name__}: {e}")
    return notes


def _error_of(cell) -> str | None:
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            evalue = (out.get("evalue") or "").strip().splitlines()
            return f"{out.get('ename')}: {evalue[0] if evalue else ''}".strip()
    return None
