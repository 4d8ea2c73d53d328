"""The training strategies, one folder each, built on the collectives: ``data`` (DDP), and
the strategies that follow (parameter servers, pipelines, tensor parallelism, ZeRO, mesh,
mixed precision, elasticity)."""
