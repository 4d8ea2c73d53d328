"""The grader on typical wrong answers, bypasses and grade-faking cells (``wrong_answers/``):
each wrong answer scores zero on the tests it breaks, with feedback that names the mistake;
each bypass and each faked grade earns nothing; a right answer in another container shape
earns full points. Tests a changed cell cannot reach are not rerun: they keep the points of
the notebook the wrong answer started from (test_notebooks.py grades those)."""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import nbformat
import pytest
from wrong_answers import ROOT, all_wrong, isolation_cheats, notebook

from minidist.grading.engine import learner
from minidist.grading.engine.fresh import warm
from minidist.grading.notebook_grader import grade_notebook, program_of
from minidist.grading.registry import stored_tests

WRONG = all_wrong()


def affected_tests(wrong) -> list[str]:
    """The tests whose code the wrong answer changed (every test, for added cells or stubs)."""
    tests = stored_tests(wrong.exercise)
    if wrong.base != "solutions" or wrong.extra:
        return list(tests)
    nb = nbformat.read(str(ROOT / "solutions" / f"{wrong.exercise}.ipynb"), as_version=4)
    changed = {i + 1 for i, c in enumerate(nb.cells)
               if c.metadata.get("nbgrader", {}).get("grade_id") in wrong.cells}
    program = program_of(nb, tests)
    return [gid for gid, t in tests.items()
            if any(s.cell in changed for s in program.select(t.needs))]


def test_there_are_typical_wrong_answers_of_every_kind():
    names = {w.name for w in WRONG}
    for kind in ("ring_whole_buffers", "rs_off_by_one_chunk", "average_no_division",
                 "buckets_forward_order", "shard_ignores_epoch", "shift_send_first",
                 "ag_send_before_recv", "naive_api_all_reduce", "shard_torch_sampler",
                 "buckets_library", "hooks_print_and_display_grades", "patch_grading_modules",
                 "forged_result_files", "ring_rows_not_flattened", "pong_no_barrier",
                 "shard_pads_once", "shift_sendrecv", "naive_all_reduce_coalesced",
                 "predict_no_latency", "hd_recursive_doubling", "hd_library",
                 "hooks_after_backward", "hooks_naive_wrapper", "bucket_when_ready_in_any_order",
                 "bucket_per_parameter", "overlap_hook_waits", "overlap_never_waits",
                 "overlap_on_backward_thread", "sync_average_over_world_size",
                 "shard_fc_wrong_dimension", "f_no_all_reduce_backward",
                 "f_all_reduce_forward", "g_all_reduce_backward", "mlp_bias_on_every_rank",
                 "mlp_no_f", "mlp_gelu_after_the_sum", "ce_gathers_the_logits",
                 "sync_answered_twice", "sync_by_rank_not_any_source",
                 "admits_one_too_many", "serve_releases_only_the_pusher",
                 "sched_gpipe", "sched_warmup_by_rank", "sched_warmup_off_by_one",
                 "sched_backward_first", "fwd_blocking_send", "bwd_wrong_neighbour",
                 "step_mean_of_losses", "coords_first_dimension_fastest",
                 "groups_color_and_key_swapped", "groups_adjacent_blocks",
                 "groups_key_reversed", "groups_torch_init_device_mesh", "dpsync_over_tp",
                 "dpsync_over_every_group", "zero_bounds_clamped_to_numel",
                 "zero_step_full_tensor", "zero_step_unpadded_reduce_scatter",
                 "zero_step_no_all_gather", "zero_step_summed", "zero_bucket_all_reduce",
                 "scale_grows_one_step_early", "scale_tracker_not_reset_on_backoff",
                 "agree_local_only", "step_not_skipped", "master_unscale_in_float16",
                 "zoo10_avg_summed", "zoo10_ring_whole_buffers", "zoo10_inf_not_agreed",
                 "zoo10_sampler_no_set_epoch", "zoo10_zero_torch_split",
                 "zoo10_fp16_no_loss_scaling", "zoo10_pipe_warmup_not_capped",
                 "hier_whole_tensor_across_nodes", "hier_flat_ring",
                 "hier_node_colour_assumes_2_per_node", "topk_residual_not_carried",
                 "topk_signed_not_magnitude", "topk_sum_not_average",
                 "topk_dense_all_reduce", "files_ring_all_reduce", "files_ring_reduce_scatter",
                 "files_hierarchical_all_reduce", "hier_leader_only", "hier_across_tree",
                 "files_topk_step", "files_powersgd_step", "files_zoo10_ring",
                 "dpsync_replaces_list_entries", "step_never_waits_its_sends",
                 "zoo10_zero_dense_all_reduce", "zoo10_pipe_gpipe",
                 "cheat_inspect_grader_frames", "cheat_gc_reference_tensors",
                 "cheat_wrapper_globals_original", "cheat_exec_library_source",
                 "cheat_double_fork_survivor", "cheat_kill_the_grader",
                 "cheat_rank_kills_its_launcher"):
        assert kind in names
    assert len(WRONG) >= 50


MIN_WRONG_PER_TEST = 10  # plausible wrong answers that must each lose a graded test's points


def test_every_graded_test_has_ten_wrong_answers_that_lose_its_points():
    from minidist.grading.registry import EXERCISES

    counts = {(e, gid): 0 for e in EXERCISES for gid, t in stored_tests(e).items() if t.points}
    for w in WRONG:
        for gid in w.expect:
            if (w.exercise, gid) in counts:  # practice checks (0 points) are not counted
                counts[(w.exercise, gid)] += 1
    short = {k: n for k, n in counts.items() if n < MIN_WRONG_PER_TEST}
    assert not short, f"graded tests with fewer than {MIN_WRONG_PER_TEST} wrong answers: {short}"


# Fixtures graded at once. A grading mostly waits (on its ranks, its children's start, a
# deadlock's timeout): one at a time keeps a 2-core machine about half busy. The cheats that
# kill or outlive processes run alone, before the others start. The others are graded in
# worker processes, not threads: CPython 3.11 keeps the AST constructor's recursion depth in
# interpreter-wide state, so two threads in ast.parse at once (the grader reading a notebook,
# pytest formatting a failure) can raise "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905), which ended a CI run with an INTERNALERROR.
CONCURRENT = 2
ALONE = {w.name for w in isolation_cheats.WRONG}
QUICK_DEADLOCK = 2.0  # seconds a learner's receive waits before the grader calls it a deadlock


def _grade(wrong, root):
    path = root / wrong.name / f"{wrong.exercise}.ipynb"
    path.parent.mkdir()
    nbformat.write(notebook(wrong), str(path))
    return grade_notebook(path, timeout=wrong.timeout, only=affected_tests(wrong))


def _start_worker():
    learner.COMM_TIMEOUT = QUICK_DEADLOCK
    warm()


@pytest.fixture(scope="module")
def reports(request, tmp_path_factory):
    """The report of each selected fixture: the lone ones graded first, here, then the others
    CONCURRENT at a time in worker processes, in test order; a test waits for its own."""
    selected = [item.callspec.params["wrong"] for item in request.session.items
                if getattr(item, "originalname", "") == "test_grader_sees_through"]
    root, saved = tmp_path_factory.mktemp("wrong"), learner.COMM_TIMEOUT
    _start_worker()
    alone = {w.name: _grade(w, root) for w in selected if w.name in ALONE}
    later = [w for w in selected if w.name not in ALONE]
    pool = ProcessPoolExecutor(min(CONCURRENT, max(len(later), 1)), initializer=_start_worker,
                               mp_context=multiprocessing.get_context("spawn"))
    futures = {w.name: pool.submit(_grade, w, root) for w in later}
    yield lambda w: alone[w.name] if w.name in alone else futures[w.name].result()
    pool.shutdown(cancel_futures=True)
    learner.COMM_TIMEOUT = saved


@pytest.mark.slow
@pytest.mark.parametrize("wrong", WRONG, ids=[w.name for w in WRONG])
def test_grader_sees_through(wrong, reports):
    only = affected_tests(wrong)
    assert set(wrong.expect) <= set(only), "a test the change cannot reach"
    report = reports(wrong)
    assert report.error is None, report.error
    for r in report.results:
        if r["grade_id"] in wrong.expect:
            assert r["earned"] == 0, r
            assert wrong.expect[r["grade_id"]] in r["feedback"], r["feedback"]
        else:
            full = wrong.base == "solutions"
            assert r["earned"] == (r["points"] if full else 0), r
    if wrong.base == "solutions" and not wrong.passes:  # partial points: the rest stands
        assert set(stored_tests(wrong.exercise)) - set(only)
