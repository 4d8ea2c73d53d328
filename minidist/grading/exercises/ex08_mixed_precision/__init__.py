"""Exercise 08, dynamic loss scaling by hand (Micikevicius et al., "Mixed Precision
Training", ICLR 2018, section 3.2; torch.amp.GradScaler's schedule), agreed across ranks.

``update_scale`` runs closed loop (each step's output is the next step's input) on overflow
sequences, against ``torch.amp.GradScaler``'s own scale and growth tracker step by step,
with torch's defaults (2000 clean steps before a growth) and with other factors.
``agree_found_inf`` runs in launched worlds of 1 to 4 ranks where none, one or every rank
found an inf. ``scaled_step`` (and the stretch, ``master_step``: float16 model, float32
master weights) runs ten (eight) steps of SGD on 1 to 4 ranks that each hold a different
piece of the model, one rank's gradients overflowing at some steps, against ONE process
holding every piece under one torch GradScaler (``ranks.torch_steps``). minidist's
GradScaler and master-weight wrapper, torch's GradScaler (and so its CUDA and sharded
subclasses) and its fused unscale/update kernels are out of reach (``sandbox.AMP``);
``md.all_reduce`` stays.
"""

from ...engine.sandbox import AMP
from ...engine.spec import Exercise, GradedTest
from . import checks

RULES = (AMP,)
EXERCISE = Exercise("08_mixed_precision", (
    GradedTest("test_update_scale", 3, ("update_scale",), checks.check_update_scale, RULES),
    GradedTest("test_agree_found_inf", 2, ("agree_found_inf",), checks.check_agree_found_inf,
               RULES),
    GradedTest("test_scaled_step", 4, ("scaled_step",), checks.check_scaled_step, RULES),
    GradedTest("test_master_step", 3, ("master_step",), checks.check_master_step, RULES,
               part="stretch"),
))
