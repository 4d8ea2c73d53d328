"""Wrong (and rightly different) answers to exercise 08: a loss scale that grows a step early
or late, a tracker not reset, factors hard-coded, a flag not agreed (or agreed with min), a
step not skipped or not unscaled, gradients unscaled in float16, a master not copied back,
and the library's or torch's scaler in place of the learner's."""

from . import Wrong

EX = "08_mixed_precision"
SCALE, AGREE, STEP, MASTER = ("test_update_scale", "test_agree_found_inf", "test_scaled_step",
                              "test_master_step")
SCALE_DEF = ("def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, "
             "backoff_factor=0.5,\n                 growth_interval=2000):\n")
RIGHT_SCALE = """\
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker
"""
FINITE_SCALE = RIGHT_SCALE.replace("        return scale * growth_factor, 0\n", """\
        grown = scale * growth_factor
        return (grown if math.isfinite(grown) else scale), 0
""")
STEP_DEF = "def scaled_step(comm, optimizer, state):\n"
GRADS = """\
    grads = [p.grad for group in optimizer.param_groups for p in group["params"]
             if p.grad is not None]
"""
UPDATE = """\
    state["scale"], state["growth_tracker"] = update_scale(
        state["scale"], state["growth_tracker"], found_inf, state["growth_factor"],
        state["backoff_factor"], state["growth_interval"])
"""
RIGHT_STEP = GRADS + """\
    found_inf = agree_found_inf(comm, any(not torch.isfinite(g).all() for g in grads))
    if not found_inf:
        for g in grads:
            g.div_(state["scale"])
        optimizer.step()
""" + UPDATE + "    return not found_inf\n"
MASTER_DEF = "def master_step(comm, model_params, master_params, optimizer, state):\n"
RIGHT_MASTER = """\
    found_inf = agree_found_inf(comm, any(not torch.isfinite(m.grad).all()
                                          for m in model_params))
    if not found_inf:
        for m, w in zip(model_params, master_params):
            w.grad = m.grad.float() / state["scale"]
        optimizer.step()
        with torch.no_grad():
            for m, w in zip(model_params, master_params):
                m.copy_(w)
""" + UPDATE + "    return not found_inf\n"


def scale(body: str) -> dict:
    return {"update_scale": SCALE_DEF + body}


def agree(body: str) -> dict:
    return {"agree_found_inf": "def agree_found_inf(comm, found_inf):\n" + body}


def step(body: str) -> dict:
    return {"scaled_step": STEP_DEF + body}


def master(body: str) -> dict:
    return {"master_step": MASTER_DEF + body}


LOCAL = {"agree_found_inf": "def agree_found_inf(comm, found_inf):\n    return found_inf\n"}

WRONG = [
    # -- part 1: the schedule
    Wrong("scale_grows_one_step_early", EX, scale(RIGHT_SCALE.replace(
        "growth_tracker == growth_interval", "growth_tracker == growth_interval - 1")),
        {SCALE: "grew after 1999 clean steps (growth_interval=2000): the tracker must reach "
                "growth_interval", STEP: "grew after 2 clean steps (growth_interval=3)",
         MASTER: "grew after 2 clean steps (growth_interval=3)"}),
    Wrong("scale_grows_one_step_late", EX, scale("""\
    if found_inf:
        return scale * backoff_factor, 0
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker + 1
"""), {SCALE: "did not grow after 2000 clean steps in a row (growth_interval=2000)",
       STEP: "did not grow after 3 clean steps in a row",
       MASTER: "did not grow after 3 clean steps in a row"}),
    Wrong("scale_tracker_not_reset_on_backoff", EX, scale(RIGHT_SCALE.replace(
        "return scale * backoff_factor, 0", "return scale * backoff_factor, growth_tracker")),
        {SCALE: "at step 2003 (found_inf=True, going in with scale=131072, tracker=3) your "
                "update returned (scale=65536, tracker=3), torch's GradScaler (scale=65536, "
                "tracker=0): an overflow resets the tracker to 0 (the count of clean steps in "
                "a row starts again), you kept the count of clean steps. You reset the "
                "tracker on growth but not on backoff",
         STEP: "an overflow resets the tracker to 0", MASTER: "you kept the count"}),
    Wrong("scale_tracker_not_reset_on_growth", EX, scale(RIGHT_SCALE.replace(
        "return scale * growth_factor, 0", "return scale * growth_factor, growth_tracker")),
        {SCALE: "grew at the right step, but the tracker must start again at 0 after a growth",
         STEP: "the tracker must start again at 0",
         MASTER: "the tracker must start again at 0"}),
    Wrong("scale_no_backoff", EX, scale(RIGHT_SCALE.replace(
        "return scale * backoff_factor, 0", "return scale, 0")),
        {SCALE: "did not back off at an overflow", STEP: "did not back off at an overflow",
         MASTER: "did not back off at an overflow"}),
    Wrong("scale_hardcoded_factors", EX, scale(RIGHT_SCALE.replace(
        "scale * backoff_factor", "scale * 0.5").replace("scale * growth_factor",
                                                         "scale * 2")),
        {SCALE: "with init_scale=16, growth_factor=3.0, backoff_factor=0.25, growth_interval=2: "
                "at step 1 (found_inf=False, going in with scale=16, tracker=1) your update "
                "returned (scale=32, tracker=0), torch's GradScaler (scale=48, tracker=0): "
                "grew by 2, not by growth_factor=3: use the argument"}),
    Wrong("scale_counts_overflows", EX, scale("""\
    growth_tracker += 1
    if found_inf:
        return scale * backoff_factor, growth_tracker
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker
"""), {SCALE: "you counted the overflowing step as a clean one",
       STEP: "you counted the overflowing step as a clean one",
       MASTER: "you counted the overflowing step as a clean one"}),
    Wrong("scale_torch_fused_kernel", EX, scale("""\
    s, t = torch.tensor([float(scale)]), torch.tensor([growth_tracker], dtype=torch.int32)
    torch._amp_update_scale_(s, t, torch.tensor([float(found_inf)]), growth_factor,
                             backoff_factor, growth_interval)
    return s.item(), t.item()
"""), {SCALE: "torch._amp_update_scale_ is not allowed in this exercise",
       STEP: "is not allowed in this exercise", MASTER: "is not allowed in this exercise"}),
    Wrong("scale_library", EX, scale("""\
    from minidist.parallel.amp import next_scale
    return next_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                      growth_interval)
"""), {SCALE: "minidist.parallel.amp.grad_scaler.next_scale is not allowed",
       STEP: "next_scale is not allowed", MASTER: "next_scale is not allowed"}),
    Wrong("scale_as_tensors", EX, scale("""\
    scale = torch.tensor(float(scale))
    if found_inf:
        return scale * backoff_factor, torch.tensor(0)
    if growth_tracker + 1 == growth_interval:
        grown = scale * growth_factor
        return torch.where(torch.isfinite(grown), grown, scale), torch.tensor(0)
    return scale, torch.tensor(growth_tracker + 1)
"""), passes=True),
    Wrong("scale_grows_to_inf", EX, scale(RIGHT_SCALE),  # no check that the growth is finite
          {SCALE: "with init_scale=8, growth_factor=inf, backoff_factor=0.5, growth_interval=2: "
                  "at step 1 (found_inf=False, going in with scale=8, tracker=1) your update "
                  "returned (scale=inf, tracker=0), torch's GradScaler (scale=8, tracker=0): "
                  "grew to inf: scale * growth_factor (8 * inf) is not finite, and torch then "
                  "keeps the scale"}),
    Wrong("scale_inf_growth_keeps_tracker", EX, scale("""\
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        grown = scale * growth_factor
        if math.isfinite(grown):
            return grown, 0
    return scale, growth_tracker
"""), {SCALE: "kept the scale where scale * growth_factor is not finite, right, but returned "
              "tracker=2: the count reached growth_interval=2, so the tracker starts again at "
              "0 even though the scale could not grow"}),
    Wrong("scale_backoff_divides", EX, scale(FINITE_SCALE.replace(
        "scale * backoff_factor", "scale / backoff_factor")),
        {SCALE: "at step 2003 (found_inf=True, going in with scale=131072, tracker=3) your "
                "update returned (scale=262144, tracker=0), torch's GradScaler (scale=65536, "
                "tracker=0): divided by backoff_factor=0.5 at an overflow, which grows the "
                "scale: multiply by it",
         STEP: "divided by backoff_factor=0.5 at an overflow",
         MASTER: "divided by backoff_factor=0.5 at an overflow"}),
    Wrong("scale_growth_checked_before_overflow", EX, scale("""\
    growth_tracker += 1
    if growth_tracker == growth_interval:
        grown = scale * growth_factor
        return (grown if math.isfinite(grown) else scale), 0
    if found_inf:
        return scale * backoff_factor, 0
    return scale, growth_tracker
"""), {SCALE: "with init_scale=8, growth_factor=2.0, backoff_factor=0.5, growth_interval=3: "
              "at step 7 (found_inf=True, going in with scale=8, tracker=2) your update "
              "returned (scale=16, tracker=0), torch's GradScaler (scale=4, tracker=0): grew "
              "at an overflowing step (the tracker was at 2, one short of growth_interval=3, "
              "and you counted this step): check found_inf first",
       STEP: "grew at an overflowing step", MASTER: "grew at an overflowing step"}),
    # -- part 2: the agreement
    Wrong("agree_local_only", EX, LOCAL,
          {AGREE: "ranks disagreed with world_size=2, only rank 0 found an inf: rank 0 "
                  "returned True, rank 1 returned False, so some would skip the step and "
                  "others take it, and the replicas diverge for good. All-reduce found_inf "
                  "with op=\"max\"",
           STEP: "ranks disagreed on skipping at step 3: rank 1 skipped, rank 0 stepped",
           MASTER: "ranks disagreed on skipping at step 3: rank 2 skipped, ranks 0 and 1 "
                   "stepped"}),
    Wrong("agree_min", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.all_reduce(comm, flag, op="min")
    return bool(flag.item())
"""), {AGREE: "with world_size=2, only rank 0 found an inf: every rank returned False, "
              "expected True: max over the ranks",
       STEP: "did not skip the step at overflow: the parameters changed at step 3",
       MASTER: "did not skip the step at overflow"}),
    Wrong("agree_reduce_to_root", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.reduce(comm, flag, dst=0, op="max")
    return bool(flag.item())
"""), {AGREE: "ranks disagreed with world_size=2, only rank 0 found an inf: rank 0 "
              "returned True, rank 1 returned False",
       STEP: "ranks disagreed on skipping at step 6: rank 0 skipped, rank 1 stepped",
       MASTER: "ranks disagreed on skipping at step 3: ranks 0 and 2 skipped, rank 1 "
               "stepped"}),
    Wrong("agree_sum", EX, agree("""\
    flag = torch.tensor([int(found_inf)])
    md.all_reduce(comm, flag)
    return flag.item() > 0
"""), passes=True),
    Wrong("agree_all_gather_any", EX, agree("""\
    flags = md.all_gather(comm, torch.tensor([float(found_inf)]))
    return bool(flags.max() > 0)
"""), {AGREE: "with world_size=2, no rank found an inf: the answers were right, but rank 0 "
              "called md.all_gather of 1 value, where exactly one md.all_reduce of one value "
              "(op=\"max\", or a sum > 0) gives every rank the answer"}),
    Wrong("agree_broadcast_from_rank_0", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.broadcast(comm, flag, src=0)
    return bool(flag.item())
"""), {AGREE: "with world_size=2, only rank 1 found an inf: every rank returned False, "
              "expected True: a broadcast hands every rank the src rank's flag and drops the "
              "others'",
       STEP: "did not skip the step at overflow", MASTER: "did not skip the step at overflow"}),
    Wrong("agree_returns_local_flag", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.all_reduce(comm, flag, op="max")
    return found_inf
"""), {AGREE: "Your md.all_reduce of the flag ran, but what the ranks returned is not its "
              "result: return the reduced tensor's value",
       STEP: "ranks disagreed on skipping at step 3", MASTER: "ranks disagreed on skipping"}),
    Wrong("agree_all_reduce_then_broadcast", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.all_reduce(comm, flag, op="max")
    md.broadcast(comm, flag, src=0)  # to be sure every rank holds the same flag
    return bool(flag.item())
"""), {AGREE: "rank 0 called md.all_reduce of 1 value (op='max'), md.broadcast of 1 value, "
              "where exactly one md.all_reduce of one value"}),
    Wrong("agree_one_slot_per_rank", EX, agree("""\
    flags = torch.zeros(comm.world_size)
    flags[comm.rank] = float(found_inf)
    md.all_reduce(comm, flags)
    return bool(flags.any())
"""), {AGREE: "rank 0 called md.all_reduce of 2 values (op='sum'): the flag is one value (1.0 "
              "or 0.0) whatever the world size"}),
    Wrong("agree_sum_equals_one", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.all_reduce(comm, flag)
    return flag.item() == 1.0
"""), {AGREE: "with world_size=2, every rank found an inf: every rank returned False, "
              "expected True: max over the ranks (or a sum > 0) is True when ANY rank found "
              "one"}),
    Wrong("agree_by_hand_through_rank_0", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    if comm.rank == 0:
        buf = torch.zeros(1)
        for src in range(1, comm.world_size):
            comm.recv(buf, src)
            flag = torch.maximum(flag, buf)
        for dst in range(1, comm.world_size):
            comm.send(flag, dst)
    else:
        comm.send(flag, 0)
        comm.recv(flag, 0)
    return bool(flag.item())
"""), {AGREE: "rank 0 called no md collective and sent 1 message(s) by hand: agreeing on a "
              "flag is one collective"}),
    Wrong("agree_only_ranks_that_found", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    if found_inf:  # only a rank with news has to tell the others
        md.all_reduce(comm, flag, op="max")
    return bool(flag.item())
"""), {AGREE: "found an inf",  # the case and who waited for whom: both timing
       STEP: "returned from",  # "deadlock in scaled_step: rank 0 returned from scaled_step"
                               # or "rank 0 returned from its function while rank 1 waited"
       MASTER: "ranks disagreed on skipping at step 3"},
        timeout=60.0),
    Wrong("agree_coalesced_avg", EX, agree("""\
    flag = torch.tensor([float(found_inf)])
    md.all_reduce_coalesced(comm, [flag], op="avg")
    return bool(flag.item() > 0)
"""), passes=True),
    # -- part 3: the step
    Wrong("step_not_skipped", EX, step(GRADS + """\
    found_inf = agree_found_inf(comm, any(not torch.isfinite(g).all() for g in grads))
    for g in grads:
        if found_inf:
            g.zero_()
        else:
            g.div_(state["scale"])
    optimizer.step()
""" + UPDATE + "    return not found_inf\n"),
        {STEP: "with world_size=1, step 3: did not skip the step at overflow: the parameters "
               "changed at step 3 where the gradients of rank 0 held inf"}),
    Wrong("step_no_unscale", EX, step(RIGHT_STEP.replace(
        '            g.div_(state["scale"])\n', "            pass\n")),
        {STEP: "the update is 1024 (the scale) times too large"}),
    Wrong("step_unscale_with_updated_scale", EX, step(GRADS + """\
    found_inf = agree_found_inf(comm, any(not torch.isfinite(g).all() for g in grads))
""" + UPDATE + """\
    if not found_inf:
        for g in grads:
            g.div_(state["scale"])
        optimizer.step()
    return not found_inf
"""), {STEP: "the gradients were divided by the scale after update_scale changed it"}),
    Wrong("step_state_not_stored", EX, step(RIGHT_STEP.replace(
        'state["scale"], state["growth_tracker"] = update_scale(', "update_scale(")),
        {STEP: "state['scale'] and state['growth_tracker'] did not change"}),
    Wrong("step_returns_found_inf", EX, step(RIGHT_STEP.replace(
        "return not found_inf", "return found_inf")),
        {STEP: "step 0: rank 0's scaled_step returned False, expected True"}),
    Wrong("step_torch_grad_scaler", EX, step("""\
    scaler = torch.amp.GradScaler("cpu", init_scale=state["scale"])
    scaler.step(optimizer)
    scaler.update()
    return True
"""), {STEP: "torch.amp.grad_scaler.GradScaler is not allowed in this exercise"}),
    Wrong("step_library_scaler", EX, step("""\
    scaler = md.GradScaler(comm, init_scale=state["scale"])
    scaler.step(optimizer)
    scaler.update()
    return True
"""), {STEP: "minidist.parallel.amp.grad_scaler.GradScaler is not allowed"}),
    # -- part 4 (stretch): master weights
    Wrong("master_unscale_in_float16", EX, master(RIGHT_MASTER.replace(
        'm.grad.float() / state["scale"]', '(m.grad / state["scale"]).float()')),
        {MASTER: "the gradients were unscaled in float16"}),
    Wrong("master_not_copied_back", EX, master(RIGHT_MASTER.replace(
        "                m.copy_(w)\n", "                pass\n")),
        {MASTER: "the float16 model was not updated: copy the master weights back"}),
    Wrong("master_not_skipped", EX, master(RIGHT_MASTER.replace(
        "    if not found_inf:\n        for m, w", "    if True:\n        for m, w")),
        {MASTER: "did not skip the step at overflow"}),
]
