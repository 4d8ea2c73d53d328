"""Answers right in value that break the contract or drop the mechanism (issue 27): the
caller's objects unchanged (exercise 07's gradients replaced in the list, not averaged in
place), requests never completed (exercise 04's pipeline step returns without waiting for
its sends), and bug-zoo "fixes" that swap the mechanism for a simpler one (exercise 10: a
dense all_reduce instead of ZeRO's shards; GPipe instead of 1F1B). Each loses the points,
with a hint that names the contract or the mechanism."""

from . import Wrong
from .exercise_04 import step
from .exercise_10 import buggy

WRONG = [
    Wrong("dpsync_replaces_list_entries", "07_hybrid_parallelism", {"sync_gradients": """\
def sync_gradients(groups, grads):
    for i, g in enumerate(grads):
        grads[i] = md.all_reduce(groups["dp"], g.clone(), op="avg")
"""}, {"test_sync_gradients": "was replaced by a new tensor, so the caller's tensor (a model's "
                              "p.grad) never changed"}),
    Wrong("step_never_waits_its_sends", "04_pipeline_parallel", {"pipeline_step": step(
        "loss_fn(out, ys[i]) * (len(xs[i]) / n)")["pipeline_step"].replace(
        "    for request in pending:\n        request.wait()\n", "")},
        {"test_pipeline_step": "wait for every request in pending before returning"}),
        # (which stage reports first, and so which neighbour it names, depends on timing)
    Wrong("zoo10_zero_dense_all_reduce", "10_bug_zoo", {"zero_sgd_step": """\
def zero_sgd_step(comm, params, grad, lr):
    g = grad.clone()
    md.all_reduce(comm, g, op="avg")  # every rank the whole mean gradient
    params.sub_(lr * g)
"""}, {"test_zero_sgd_step": "the parameters are right, but rank 0 all-reduced 12 elements "
                             "(the whole gradient): that is data parallelism"}),
    Wrong("zoo10_pipe_gpipe", "10_bug_zoo", buggy(
        "pipeline_1f1b", ("warmup = p - r - 1  # forwards in flight before the first backward",
                          "warmup = m  # every forward first: GPipe")),
        {"test_pipeline_1f1b": "the loss and gradients are right, but stage 0 ran F F F B B B"}),
]
