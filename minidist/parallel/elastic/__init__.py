"""Elastic training: keep training when ranks die or join (``md.elastic``).

Anchors: torchrun's elastic agent (``--nnodes=MIN:MAX``, a rendezvous, ``--max-restarts``;
every worker restarted on a membership change; TorchElastic's design doc) and Horovod
Elastic (``hvd.elastic.run``, ``state.commit()``, ``state.restore()``,
``HostsUpdatedInterrupt``). The names follow them::

    def train(comm, rdzv):                        # one attempt, on every rank
        model = make_model()
        ddp = md.DistributedDataParallel(model, comm)     # or md.ZeRO(model, comm, ...)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
        state = md.elastic.TorchState(rdzv.store, ddp, opt,
                                      sampler=md.elastic.ElasticSampler(len(X), 32))
        def step(batch):                          # this rank's part of the global batch
            opt.zero_grad()
            losses = F.mse_loss(ddp(X[batch.ids]), Y[batch.ids], reduction="none").mean(1)
            batch.mean(losses).backward()         # the global batch's mean, any world size
            opt.step()
        md.elastic.run(step, comm, state, rdzv, epochs=3, commit_every=4)
        return [p.detach() for p in model.parameters()]

    out = md.elastic.launch(train, 4, min_ranks=2, max_restarts=3, timeout=30)
    out.attempts                                  # world sizes, rollbacks, failures

Design: relaunch, as torchrun, not in-process repair, as Horovod. When a rank dies here,
``md.launch`` stops the whole job within milliseconds (as torchrun's agent and MPI's
default error handler do). The survivors could not simply carry on anyway: a rank killed in
the middle of a ring all-reduce leaves the others with half-reduced buckets and a
shared-memory channel whose writer died mid-message, and ``comm.split`` is collective over
the *old* communicator (every member must call it, the dead one included: that is why MPI
needed ULFM's ``MPI_Comm_shrink`` to do this). So the agent (``agent.py``) relaunches the
job with the survivors' count from the last commit; all ranks reload it (``state.py``,
re-sharding ZeRO's optimizer state for the new world, ``full_state.py``) and re-cut the rest
of the epoch for the new world size (``elastic_sampler.py``). A real death (SIGKILL) is handled, not
a polite exit, and the test can kill a process for real.

Membership agreement: between commits nobody changes the membership except by failing.
At each commit rank 0 asks the rendezvous how many slots are offered and broadcasts the
answer (``loop.check_membership``), so all ranks stop at the same commit, and the agent
alone decides the next world (it is the only process that sees every rank: torchrun's
rendezvous plays this part across machines).

Joining: a rank joins at a commit point. ``discover(step)`` (Horovod's host-discovery
script) says how many slots the cluster offers; when it grows, every rank commits and stops
and the agent relaunches one more, which starts from that commit like everyone else; no
step is lost. Horovod keeps the old workers alive and syncs the new one by broadcast; here
a join costs a restart (measured by ``minidist bench elastic``).

Cost (``costmodel.elastic``): commits add ``t_commit / k`` per step; a failure costs
``t_restart + (k - 1) / 2 * t_step`` on average (the steps since the last commit are
redone); with a failure every MTBF seconds the best interval is Young's
``k t_step = sqrt(2 t_commit MTBF)``.
"""

from ...costmodel.elastic import failure_seconds, lost_steps, overhead, young_interval
from .agent import Attempt, ElasticError, ElasticResults, NotEnoughRanksError, launch
from .elastic_sampler import ElasticBatch, ElasticSampler
from .full_state import FullState, export_state, import_state
from .loop import HostsUpdatedInterrupt, check_membership, run
from .rendezvous import Rendezvous
from .state import CommitError, CommitStore, TorchState

__all__ = [
    "Attempt", "CommitError", "CommitStore", "ElasticBatch", "ElasticError", "ElasticResults",
    "ElasticSampler", "FullState", "HostsUpdatedInterrupt", "NotEnoughRanksError",
    "Rendezvous", "TorchState", "check_membership", "export_state", "failure_seconds",
    "import_state", "launch", "lost_steps", "overhead", "run", "young_interval",
]
