"""Pipeline parallelism: the model split into stages, micro-batches flowing through them.

``schedules.py``: each stage's action list for naive, GPipe, 1F1B and interleaved 1F1B;
``simulator.py``: runs action lists against each other (deadlock, completeness, memory,
bubble) with no process at all; ``stage.py``: ``PipelineStage``, one rank's submodule run on
micro-batches; ``p2p.py``: its messages to its neighbours (activations, gradients, shape
headers), on the stage's device; ``schedule.py``: the runtime that executes an action list
(``ScheduleNaive``, ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``,
``PipelineSchedule`` for any list); ``partition.py``: cutting a model into balanced stages,
with a per-stage report; ``measure.py``: activation bytes and the bubble measured from a
timeline. ``md.pipeline`` is this package:

    md.pipeline.actions("1f1b", stages=4, microbatches=8)
    md.pipeline.simulate(lists).bubble      # (p - 1) / (m + p - 1) = 3/11 here
"""

from ...costmodel import bubble_fraction
from .measure import LiveSavedBytes, ModuleSpans, SavedBytes, compute_events, measured_bubble
from .partition import SPLIT_BY, layer_costs, partition, split_model, stage_report
from .schedule import (
    PipelineSchedule,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleNaive,
)
from .schedules import SCHEDULES, actions, gpipe, interleaved, naive, one_f_one_b, peak_in_flight
from .simulator import Event, Report, Wait, simulate
from .stage import PipelineStage

__all__ = ["SCHEDULES", "SPLIT_BY", "Event", "LiveSavedBytes", "ModuleSpans", "PipelineSchedule",
           "PipelineStage", "Report", "SavedBytes", "Schedule1F1B", "ScheduleGPipe",
           "ScheduleInterleaved1F1B", "ScheduleNaive", "Wait", "actions", "bubble_fraction",
           "compute_events", "gpipe", "interleaved", "layer_costs", "measured_bubble", "naive",
           "one_f_one_b", "partition", "peak_in_flight", "simulate", "split_model",
           "stage_report"]
